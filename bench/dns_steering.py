"""Benchmark DNS steering on a real pdns: admitted share per 10% step, stickiness, and UPDATE-to-served latency."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dns.asyncquery
import dns.rcode
import dns.tsig

from activities.contracts.dns import SteerSetInput, ecs_subnets, parse_server
from activities.dns.actions import steer_set
from activities.dns.ecs import query_clients
from activities.dns.steering import steering_update
from activities.secrets import VaultSecretRef, use_client_factory
from lab.dns import PdnsLab, PdnsSettings, free_dns_port, prepare, start, stop

__all__ = ["main", "run"]

GAME_IP = "10.20.0.10"
MAINT_IP = "10.20.0.99"
GOAL_MAX_ERROR = 0.5  # percentage points
GOAL_LATENCY_MS = 50.0
PROBES = 8  # newly admitted clients polled after an UPDATE; few, so one poll round is ~ms


@dataclass
class Step:
    target: int
    measured: float
    admitted: set[int]
    kept: int  # of the previous step's admitted clients, how many are still admitted
    previous: int
    activity_ms: float
    latency_ms: float | None = None


class _StandInVault:
    """Serves the lab's key where Vault would; the activity still goes through its Vault seam."""

    def __init__(self, secret: str) -> None:
        self._secret = secret
        self.secrets = self
        self.kv = self
        self.v2 = self

    def read_secret_version(self, **_: object) -> dict[str, object]:
        return {"data": {"data": {"secret": self._secret}}}


def _admitted(answers: list[str | None]) -> set[int]:
    missing = answers.count(None)
    if missing:
        raise RuntimeError(f"{missing} clients got no answer; lower --concurrency")
    return {i for i, a in enumerate(answers) if a == GAME_IP}


async def _distribution_pass(
    lab: PdnsLab, fqdn: str, base: SteerSetInput, subnets: list, concurrency: int
) -> list[Step]:
    """Set each step through the real activity, then ask every client once."""
    steps: list[Step] = []
    previous: set[int] = set()
    for target in range(10, 101, 10):
        t0 = time.perf_counter()
        await steer_set(base.model_copy(update={"percent": target}))
        activity_ms = (time.perf_counter() - t0) * 1000
        admitted = _admitted(await query_clients(lab.settings.address, fqdn, subnets, concurrency=concurrency))
        steps.append(
            Step(
                target=target,
                measured=100 * len(admitted) / len(subnets),
                admitted=admitted,
                kept=len(previous & admitted),
                previous=len(previous),
                activity_ms=activity_ms,
            )
        )
        previous = admitted
    return steps


async def _latency_pass(lab: PdnsLab, fqdn: str, base: SteerSetInput, subnets: list, steps: list[Step]) -> None:
    """Re-run the steps with raw UPDATEs and time until the newly admitted probes are served the game IP."""
    await steer_set(base.model_copy(update={"percent": 0}))
    key = dns.tsig.Key(lab.key.name, lab.key.secret, dns.tsig.HMAC_SHA256)
    host, port = parse_server(lab.settings.address)
    previous: set[int] = set()
    for step in steps:
        newly = sorted(step.admitted - previous)[:PROBES]
        stay_out = sorted(set(range(len(subnets))) - step.admitted)[:PROBES]
        probes = [subnets[i] for i in newly + stay_out]
        expected = [GAME_IP] * len(newly) + [MAINT_IP] * len(stay_out)
        # Warm the packet cache with the old answers, so the measurement includes its purge.
        await query_clients(lab.settings.address, fqdn, probes)
        update = steering_update(
            lab.settings.zone, fqdn, game_ip=GAME_IP, maint_ip=MAINT_IP, percent=step.target,
            ttl=lab.settings.record_ttl, key=key,
        )
        t0 = time.perf_counter()
        sent = asyncio.create_task(dns.asyncquery.tcp(update, host, port=port, timeout=3))
        served = None
        while time.perf_counter() - t0 < 5:
            if await query_clients(lab.settings.address, fqdn, probes) == expected:
                served = time.perf_counter()
                break
        reply = await sent
        if reply.rcode() != dns.rcode.NOERROR:
            raise RuntimeError(f"UPDATE to {step.target}% failed: {dns.rcode.to_text(reply.rcode())}")
        step.latency_ms = None if served is None else (served - t0) * 1000
        previous = step.admitted


def _report(steps: list[Step], clients: int, base: str, prefix: int) -> bool:
    print(f"\n{clients} ECS clients, one /{prefix} each from {base}; goals: error <= {GOAL_MAX_ERROR} pt, stickiness 100 %,"
          f" UPDATE-to-served <= {GOAL_LATENCY_MS:g} ms\n")
    print(f"{'target %':>8} {'measured %':>10} {'error pt':>8} {'kept':>11} {'set() ms':>9} {'served ms':>9}")
    for s in steps:
        kept = f"{s.kept}/{s.previous}"
        lat = "timeout" if s.latency_ms is None else f"{s.latency_ms:.1f}"
        error = s.measured - s.target
        print(f"{s.target:>8} {s.measured:>10.2f} {error:>+8.2f} {kept:>11} {s.activity_ms:>9.1f} {lat:>9}")
    max_error = max(abs(s.measured - s.target) for s in steps)
    previous_total = sum(s.previous for s in steps)
    stickiness = 100.0 * sum(s.kept for s in steps) / previous_total if previous_total else 100.0
    latencies = [s.latency_ms for s in steps if s.latency_ms is not None]
    timeouts = len(steps) - len(latencies)
    median = statistics.median(latencies) if latencies else float("nan")
    worst = max(latencies) if latencies else float("nan")
    activity = [s.activity_ms for s in steps]

    ok_err = max_error <= GOAL_MAX_ERROR
    ok_sticky = stickiness == 100.0
    ok_lat = timeouts == 0 and worst <= GOAL_LATENCY_MS
    print()
    print(f"max error            {max_error:.2f} pt   {'ok' if ok_err else 'MISSED'} (goal <= {GOAL_MAX_ERROR})")
    print(f"stickiness           {stickiness:.2f} %   {'ok' if ok_sticky else 'MISSED'} (goal 100)")
    lost = f", {timeouts} timeouts" if timeouts else ""
    print(f"UPDATE-to-served     median {median:.1f} ms, max {worst:.1f} ms{lost}"
          f"   {'ok' if ok_lat else 'MISSED'} (goal <= {GOAL_LATENCY_MS:g})")
    print(f"dns.steer.set        median {statistics.median(activity):.1f} ms, max {max(activity):.1f} ms"
          " (AXFR + UPDATE + AXFR read-back; for information)")
    return ok_err and ok_sticky and ok_lat


async def run(
    clients: int, concurrency: int, state_dir: Path, ecs_base: str = "10.0.0.0/8", ecs_prefix: int = 24
) -> bool:
    settings = PdnsSettings(port=free_dns_port(), game_ip=GAME_IP, maint_ip=MAINT_IP, start_percent=0)
    lab = prepare(state_dir, settings)
    proc = start(lab)
    try:
        fqdn = settings.steering_fqdns[0]
        token = state_dir / "bench-vault-token"
        token.write_text("bench\n")
        base = SteerSetInput(
            zone=settings.zone, name=fqdn, servers=[settings.address], game_ip=GAME_IP, maint_ip=MAINT_IP,
            percent=0, ttl=settings.record_ttl, tsig_key_name=settings.key_name,
            tsig_secret=VaultSecretRef(address="http://vault.invalid:8200", path="coldstart/dns-tsig",
                                       field="secret", token_file=str(token)),
        )
        subnets = ecs_subnets(ecs_base, ecs_prefix, clients)
        vault = _StandInVault(lab.key.secret)
        with use_client_factory(lambda url, tok, verify: vault):
            t0 = time.perf_counter()
            steps = await _distribution_pass(lab, fqdn, base, subnets, concurrency)
            await _latency_pass(lab, fqdn, base, subnets, steps)
        print(f"(ran in {time.perf_counter() - t0:.0f} s against pdns on {settings.address})")
        return _report(steps, clients, ecs_base, ecs_prefix)
    finally:
        stop(proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--ecs-base", default="10.0.0.0/8", help="network the client subnets are cut from")
    parser.add_argument("--ecs-prefix", type=int, default=24, help="prefix length of each client subnet")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dns-steering-bench-") as tmp:
        ok = asyncio.run(run(args.clients, args.concurrency, Path(tmp), args.ecs_base, args.ecs_prefix))
    return 0 if ok or not args.strict else 1


if __name__ == "__main__":
    sys.exit(main())

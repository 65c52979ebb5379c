"""Consul contention model: KV apply latency and leader contact as functions of load, streaming and slow disks."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

__all__ = ["LoadModel", "LoadParams"]


@dataclass
class LoadParams:
    """Knobs for the curve. Defaults reproduce the postmortem's numbers: ~25-30 ms
    healthy apply and ~30 ms leader contact, ~2000 ms apply once streaming is on
    under heavy load, and a slow-disk leader in the hundreds of ms."""

    base_apply_ms: float = 25.0
    base_contact_ms: float = 30.0
    knee_rps: float = 1000.0  # effective load at which latency has doubled
    streaming_cost: float = 20.0  # streaming makes each client request this much costlier
    apply_ceiling_ms: float = 2000.0
    contact_ceiling_ms: float = 1500.0
    slow_apply_factor: float = 20.0
    slow_contact_factor: float = 25.0
    rate_window_s: float = 10.0
    jitter: float = 0.2
    default_background_rps: float = 400.0
    freelist_base_bytes: float = 16384.0
    freelist_growth_per_s: float = 262144.0  # slow server's BoltDB freelist growth
    freelist_growth_per_apply: float = 16384.0


class LoadModel:
    """Sliding-window client request rate plus the latency curve built on it."""

    def __init__(self, params: LoadParams | None = None, seed: int = 0) -> None:
        self.params = params or LoadParams()
        self._stamps: deque[float] = deque()
        self._rng = random.Random(seed)

    def note_request(self, now: float) -> None:
        self._stamps.append(now)
        self._trim(now)

    def _trim(self, now: float) -> None:
        cutoff = now - self.params.rate_window_s
        while self._stamps and self._stamps[0] < cutoff:
            self._stamps.popleft()
        # Bound memory under sustained heavy load; the rate saturates anyway.
        while len(self._stamps) > 200_000:
            self._stamps.popleft()

    def client_rate(self, now: float) -> float:
        self._trim(now)
        return len(self._stamps) / self.params.rate_window_s

    def effective_load(self, now: float, streaming: bool, background_rps: float) -> float:
        rate = self.client_rate(now) + background_rps
        return rate * (self.params.streaming_cost if streaming else 1.0)

    def _curve(self, load: float) -> float:
        # Quadratic rise past the knee: gentle at normal load, steep under contention.
        return 1.0 + (load / self.params.knee_rps) ** 2

    def _jitter(self, value: float, jitter: bool) -> float:
        if not jitter:
            return value
        j = self.params.jitter
        return value * self._rng.uniform(1.0 - j, 1.0 + j)

    def apply_ms(self, load: float, leader_slow: bool, jitter: bool = True) -> float:
        p = self.params
        value = p.base_apply_ms * self._curve(load) * (p.slow_apply_factor if leader_slow else 1.0)
        return self._jitter(min(value, p.apply_ceiling_ms), jitter)

    def contact_ms(self, load: float, leader_slow: bool, jitter: bool = True) -> float:
        p = self.params
        value = p.base_contact_ms * self._curve(load) * (p.slow_contact_factor if leader_slow else 1.0)
        return self._jitter(min(value, p.contact_ceiling_ms), jitter)

    def commit_ms(self, load: float, leader_slow: bool, jitter: bool = True) -> float:
        # Commit is the raft share of an apply; the FSM apply and RPC make up the rest.
        return 0.8 * self.apply_ms(load, leader_slow, jitter)

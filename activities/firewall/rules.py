"""The block as iptables sees it: sources let through, chain rules, the INPUT jump, iptables-save parsing."""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass, field

from pydantic import BaseModel, Field, field_validator

__all__ = ["TAG", "AllowTier", "HostFirewall", "Jump", "Rule", "render_block"]

TAG = "coldstart"


def _cidr(value: str) -> str:
    try:
        net = ipaddress.ip_network(value.strip(), strict=True)
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a CIDR with host bits clear ({exc})") from None
    if net.version != 4:
        # Only iptables (IPv4) is driven; an IPv6 allow would silently not apply.
        raise ValueError(f"{value!r}: IPv6 is not supported (iptables only)")
    return str(net)


class AllowTier(BaseModel):
    """A named group of sources let through the block, e.g. controller, operators, servers."""

    name: str = Field(min_length=1, max_length=48, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    cidrs: list[str] = Field(min_length=1)

    @field_validator("cidrs")
    @classmethod
    def _cidrs(cls, values: list[str]) -> list[str]:
        return list(dict.fromkeys(_cidr(v) for v in values))


@dataclass(frozen=True)
class Rule:
    """One rule of the block chain, in the few terms the block uses."""

    target: str
    source: str | None = None
    iface: str | None = None
    proto: str | None = None
    reject_with: str | None = None
    comment: str | None = None
    extra: tuple[str, ...] = ()

    def render(self, chain: str) -> str:
        parts = ["-A", chain]
        if self.source:
            parts += ["-s", self.source]
        if self.iface:
            parts += ["-i", self.iface]
        if self.proto:
            parts += ["-p", self.proto]
        if self.comment:
            parts += ["-m", "comment", "--comment", f'"{self.comment}"']
        parts += ["-j", self.target]
        if self.reject_with:
            parts += ["--reject-with", self.reject_with]
        return " ".join(parts)

    @property
    def tier(self) -> str | None:
        prefix = f"{TAG} tier="
        return self.comment[len(prefix):] if self.comment and self.comment.startswith(prefix) else None


@dataclass(frozen=True)
class Jump:
    """The INPUT rule sending the blocked ports to the chain."""

    ports: tuple[int, ...]
    line: str
    extra: tuple[str, ...] = ()


def _loopback_rule() -> Rule:
    return Rule(target="ACCEPT", iface="lo", comment=f"{TAG} loopback")


def _allow_rule(cidr: str, tier: str) -> Rule:
    return Rule(target="ACCEPT", source=cidr, comment=f"{TAG} tier={tier}")


def _reject_rule() -> Rule:
    # tcp-reset, not DROP: clients fail fast instead of hanging in SYN retries, which is
    # what takes the load off the service. No ESTABLISHED accept: existing non-allowed
    # connections must be cut too, so they get an RST on their next segment.
    return Rule(target="REJECT", proto="tcp", reject_with="tcp-reset", comment=f"{TAG} reject")


def _desired_chain(tiers: list[AllowTier]) -> list[Rule]:
    rules, seen = [_loopback_rule()], set()
    for tier in tiers:
        for cidr in tier.cidrs:
            if cidr not in seen:  # first tier to name a source owns it
                seen.add(cidr)
                rules.append(_allow_rule(cidr, tier.name))
    return [*rules, _reject_rule()]


def _jump_spec(chain: str, ports: list[int]) -> str:
    return f"-p tcp -m multiport --dports {','.join(map(str, ports))} -m comment --comment \"{TAG} block\" -j {chain}"


def _jump_line(chain: str, ports: list[int]) -> str:
    return f"-A INPUT {_jump_spec(chain, ports)}"


def render_block(chain: str, ports: list[int], tiers: list[AllowTier]) -> list[str]:
    """The block as iptables-save lines: the INPUT jump first, then the chain."""
    return [_jump_line(chain, ports), *(r.render(chain) for r in _desired_chain(tiers))]


def _parse_rule(tokens: list[str]) -> Rule:
    values: dict[str, str] = {}
    extra: list[str] = []
    it = iter(tokens)
    for tok in it:
        if tok in ("-s", "-i", "-p", "-j", "--reject-with", "--comment"):
            values[tok] = next(it, "")
        elif tok == "-m":
            module = next(it, "")
            # comment carries data we read; tcp is implied by -p tcp (legacy iptables prints it).
            if module not in ("comment", "tcp"):
                extra += ["-m", module]
        else:
            extra.append(tok)
    source = values.get("-s")
    if source:
        try:
            source = str(ipaddress.ip_network(source, strict=False))
        except ValueError:
            extra += ["-s", source]
            source = None
    return Rule(
        target=values.get("-j", ""),
        source=source,
        iface=values.get("-i"),
        proto=values.get("-p"),
        reject_with=values.get("--reject-with"),
        comment=values.get("--comment"),
        extra=tuple(extra),
    )


def _parse_jump(tokens: list[str], line: str) -> Jump:
    ports: tuple[int, ...] = ()
    extra: list[str] = []
    it = iter(tokens)
    for tok in it:
        if tok in ("--dports", "--dport"):
            raw = next(it, "")
            try:
                ports = tuple(sorted(int(p) for p in raw.split(",")))
            except ValueError:
                extra += [tok, raw]  # port ranges etc.: not ours, so never "already in place"
        elif tok in ("-p", "-m", "--comment", "-j"):
            next(it, None)
        else:
            extra.append(tok)
    return Jump(ports=ports, line=line, extra=tuple(extra))


@dataclass
class HostFirewall:
    """The parts of one host's filter table the block cares about."""

    chain_exists: bool = False
    rules: list[Rule] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    jumps: list[Jump] = field(default_factory=list)
    jump_index: list[int] = field(default_factory=list)  # positions (0-based) in INPUT

    @classmethod
    def parse(cls, save_output: str, chain: str) -> HostFirewall:
        fw = cls()
        input_pos = 0
        in_filter = False
        for raw in save_output.splitlines():
            line = raw.strip()
            if line.startswith("*"):
                in_filter = line == "*filter"
                continue
            if not in_filter:
                continue
            if line.startswith(f":{chain} "):
                fw.chain_exists = True
            elif line.startswith("-A "):
                tokens = shlex.split(line)
                if tokens[1] == chain:
                    fw.rules.append(_parse_rule(tokens[2:]))
                    fw.lines.append(line)
                elif tokens[1] == "INPUT":
                    if _target(tokens) == chain:
                        fw.jumps.append(_parse_jump(tokens[2:], line))
                        fw.jump_index.append(input_pos)
                    input_pos += 1
        return fw

    def allowed(self) -> dict[str, str]:
        """cidr -> tier name, in chain order."""
        return {r.source: (r.tier or "?") for r in self.rules if r.target == "ACCEPT" and r.source}


def _target(tokens: list[str]) -> str | None:
    for i, tok in enumerate(tokens[:-1]):
        if tok == "-j":
            return tokens[i + 1]
    return None

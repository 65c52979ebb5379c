"""Hostile inventories (targets/NAME.yaml): every reader answers with one located line or a value, fast.

The paths an inventory is read through, all fuzzed with the same files:
- workflows.loader.load_inventory: the CLI's `--target` and plan_run's `targets_dir`;
- workflows.loader.read_inventory: the same read of one file, without a default name;
- plan_run resolving a runbook's `target:` (its errors are runbook lines that quote the inventory's);
- the CLI's `validate --target NAME`.
Inputs: alias bombs, deep nesting, tags, binary and invalid UTF-8, control characters, duplicate keys
at depth (spelled differently but equal once read), huge lines and files, and random mutations of the
real targets/*.yaml (and of an inventory shaped like the one `coldstart lab up` writes).

Contract: an Inventory, or located `file:line:col: message` lines - one YamlRefused from the guarded
reader, or InventoryInvalid (the contract's verdict, one line per problem) for a file that reads as
YAML - never another exception, a traceback or a hang.
Each read's CPU time is bounded (BOUND_SECONDS: what the read costs, not how busy the machine is) and
the read is interrupted after HARD_SECONDS of wall time, so a hang fails the example instead of the run. Where the right answer is known (a limit crossed, the first bad byte),
the refusal's message and line are checked too.

The gaps it found (unconstructible scalars, a non-string name, a FIFO, emoji codes in the CLI) are fixed and kept as tests at the end.
"""

from __future__ import annotations

import io
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from activities.inventory import Inventory
from lab.inventory import write_inventory
from workflows import loader
from workflows.loader import InventoryInvalid, RunbookInvalid, load_inventory, plan_run
from workflows.yaml_safety import MAX_ALIASES, MAX_DEPTH, MAX_FILE_BYTES, MAX_LINE_BYTES, MAX_NODES, YamlRefused

REPO = Path(__file__).resolve().parents[1]
LOCATED = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):(?P<col>\d+): \S[^\n]*$")
NAME = "fuzz"
BOUND_SECONDS = 2.0  # CPU seconds of one read of one file, by any path (the refusals take milliseconds)
HARD_SECONDS = 10.0  # then the read is interrupted: a hang fails the example, not the run

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                                     HealthCheck.data_too_large, HealthCheck.large_base_example])

# A runbook whose target is the fuzzed inventory and which reads one of its fields.
RUNBOOK = f"""\
metadata: {{name: inventory-fuzz}}
target: {NAME}
steps:
  - id: note
    action: core.note
    with:
      message: "prometheus at ${{{{ target.telemetry.prometheus }}}}"
  - id: pause
    wait: 1s
"""

# Shaped like the inventory lab/lifecycle.build_inventory writes (targets/lab.yaml, not committed).
LAB_SEED = """\
# Written by `coldstart lab up`; removed by `coldstart lab down`. Schema: lab/inventory.py
name: lab
drill: true
description: coldstart drill lab on 10.77.0.0/24 (state /work/main/.state/lab)
telemetry:
  prometheus: http://10.77.0.20:9090
  metrics:
    players: [game_players_admitted, game_players_target]
endpoints:
  consul: [http://10.77.0.11:8500, http://10.77.0.12:8500, http://10.77.0.13:8500]
  nomad: [http://10.77.0.15:4646]
  vault: [http://10.77.0.16:8200]
  dns: [10.77.0.17]
  game: [http://10.77.0.30:8080]
  maintenance: [http://10.77.0.31:8080]
  cache: [10.77.0.41:6379, 10.77.0.42:6379, 10.77.0.43:6379]
  database: [postgresql://postgres@10.77.0.50:5432/postgres]
  extra:
    node_agents: [http://10.77.0.41:9100, http://10.77.0.42:9100]
hosts:
  consul1:
    address: 10.77.0.11
    roles: [consul-server]
    executor:
      kind: ssh
      address: 10.77.0.11
      port: 22
      user: root
      key_path: /work/main/.state/lab/ssh/client_ed25519
      known_hosts: /work/main/.state/lab/ssh/known_hosts
  cache1:
    address: 10.77.0.41
    roles: [cache, nomad-client]
    executor: {kind: netns, netns: cs-cache1}
ports:
  consul: [8500]
  nomad: [4646]
  vault: [8200]
secrets:
  consul_token: {address: 'http://10.77.0.16:8200', mount: secret, path: lab/consul, field: token}
  dns_tsig: {address: 'http://10.77.0.16:8200', mount: secret, path: lab/dns, field: tsig}
vault:
  address: http://10.77.0.16:8200
  approle_role_id_file: /work/main/.state/lab/secrets/worker-role-id
  approle_secret_id_file: /work/main/.state/lab/secrets/worker-secret-id
dns:
  zone: play.example.
  name: edge.play.example.
  servers: [10.77.0.17]
  game_ip: 10.77.0.30
  maint_ip: 10.77.0.31
  tsig_key_name: coldstart-steer.
  tsig_secret: {address: 'http://10.77.0.16:8200', path: lab/dns, field: tsig}
consul:
  address: http://10.77.0.11:8500
  servers: [http://10.77.0.11:8500, http://10.77.0.12:8500]
  token: {address: 'http://10.77.0.16:8200', path: lab/consul, field: token}
groups:
  consul_servers:
    - {name: consul1, kind: ssh, address: 10.77.0.11, port: 22, user: root,
       key_path: /work/main/.state/lab/ssh/client_ed25519, known_hosts: /work/main/.state/lab/ssh/known_hosts}
services:
  - name: matchmaker
    tier: internal
    essential: false
    usage_flag_key: flags/matchmaker
    nomad_job: matchmaker
    check_owner: nomad
    check_name: alive
  - name: chat
    check_owner: agent
    check_id: chat-alive
    check_definition: {Name: chat-alive, HTTP: 'http://10.77.0.60:8080/health', Interval: 10s}
facts:
  state_dir: /work/main/.state/lab
  consul_block_allow:
    - {name: controller, cidrs: [10.77.0.1/32]}
  nomad_job: cache
  backends: {consul: real, nomad: stand-in, vault: real}
"""

SEEDS: list[bytes] = [p.read_bytes() for p in sorted((REPO / "targets").glob("*.yaml"))] + [LAB_SEED.encode()]
BASE = f"name: {NAME}\ntelemetry: {{prometheus: 'http://127.0.0.1:9090'}}\n"
BASE_NODES = 9  # BASE and an empty `facts:` mapping: the root, two keys and values, telemetry's map, facts'


class Hung(BaseException):
    """Raised by the alarm inside a read that outlived HARD_SECONDS (a BaseException: no `except
    Exception` in the code under test can swallow it)."""


@contextmanager
def hard_limit(seconds: float = HARD_SECONDS) -> Iterator[None]:
    def expired(signum: int, frame: Any) -> None:
        raise Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def timed(call: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """call()'s value or what it raised; fails when it used more than BOUND_SECONDS of this thread's CPU
    (wall time would fail a fast read on a machine busy with other tests)."""
    started = time.thread_time()
    value, raised = None, None
    with hard_limit():
        try:
            value = call()
        except Hung:
            raise
        except Exception as exc:  # noqa: BLE001 - returned for the test to judge
            raised = exc
    seconds = time.thread_time() - started
    assert seconds < BOUND_SECONDS, f"took {seconds:.2f} s of CPU"
    return value, raised


@cache
def registry() -> Any:
    from activities.catalog import load_registry

    return load_registry()


def assert_located(exc: BaseException | None, file: Path, content: bytes) -> YamlRefused:
    assert isinstance(exc, YamlRefused), repr(exc)
    text = str(exc)
    assert LOCATED.match(text), text[:300]
    assert text.startswith(f"{file}:{exc.line}:{exc.column}: "), text[:300]
    # libyaml places an error at the end of a file without a final newline one line past it.
    assert 1 <= exc.line <= _yaml_line_breaks(content) + 2 and exc.column >= 1, (exc.line, exc.column)
    return exc


def _yaml_line_breaks(content: bytes) -> int:
    """Line breaks as YAML counts them: CR LF, and a lone CR, LF, NEL, LS or PS (a fuzzed CR starts a line too)."""
    return len(re.findall("\r\n|[\r\n\x85\u2028\u2029]", content.decode("utf-8", "replace")))


Refusal = YamlRefused | InventoryInvalid


def refusal_lines(refused: Refusal) -> list[str]:
    return refused.errors if isinstance(refused, InventoryInvalid) else [str(refused)]


def read_inventory(directory: Path, content: bytes) -> tuple[Inventory | None, Refusal | None]:
    """Both reads of one file, held to the contract and to each other; returns load_inventory's
    value and refusal."""
    file = directory / f"{NAME}.yaml"
    file.write_bytes(content)
    inventory, refused = timed(lambda: load_inventory(NAME, directory))
    alone, raised = timed(lambda: loader.read_inventory(file))
    if isinstance(refused, YamlRefused):
        assert_located(refused, file, content)
        if refused.message == "an inventory must be a mapping":
            assert refused.line == refused.column == 1
        # the same guarded reader, the same refusal
        assert isinstance(raised, YamlRefused) and str(raised) == str(refused), (repr(raised), str(refused))
        return None, refused
    if refused is not None:
        assert isinstance(refused, InventoryInvalid), repr(refused)
        assert refused.errors and all(LOCATED.match(line) and line.startswith(f"{file}:") for line in refused.errors)
        assert isinstance(raised, InventoryInvalid), repr(raised)  # without the default name, no better
        return None, refused
    assert isinstance(inventory, Inventory), repr(inventory)[:300]
    # Without a default name only a missing `name:` may differ.
    assert raised is None and alone == inventory or isinstance(raised, InventoryInvalid), repr(raised)
    return inventory, None


def plan_with_target(directory: Path, data: Any, refused: Refusal | None) -> None:
    """plan_run resolving the runbook's target from the same directory: located lines or a plan."""
    runbook, actions = directory / "runbook.yaml", registry()
    runbook.write_text(RUNBOOK)
    _, raised = timed(lambda: plan_run(runbook, registry=actions, targets_dir=directory, placeholders=True))
    if raised is None:
        assert refused is None
        return
    assert isinstance(raised, RunbookInvalid), repr(raised)
    assert raised.errors
    for line in raised.errors:
        assert LOCATED.match(line) and line.startswith(f"{runbook}:"), line[:300]
    if refused is not None:  # the inventory's own (first) located line, quoted in the runbook's error
        assert any(refusal_lines(refused)[0] in line for line in raised.errors), (str(refused), raised.errors)


def check(directory: Path, content: bytes) -> Refusal | None:
    data, refused = read_inventory(directory, content)
    plan_with_target(directory, data, refused)
    # What the examples came to (--hypothesis-show-statistics): which refusals, how many reads.
    message = refused.message if isinstance(refused, YamlRefused) else refused.errors[0].split(": ", 1)[-1] if refused else ""
    event("refused: " + re.split(r"[0-9'\"(]", message, maxsplit=1)[0].strip() if refused else "read")
    return refused


def under_facts(block: str, key: str = "x") -> str:
    """BASE with `block` as facts.<key> (facts is free-form: what reads as YAML passes the schema)."""
    indented = "".join("    " + line + "\n" for line in block.splitlines())
    return BASE + f"facts:\n  {key}:\n{indented}"


def line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


# ---- alias bombs -------------------------------------------------------------------------------

@st.composite
def alias_bombs(draw: st.DrawFn) -> tuple[str, int, int, bool]:
    """(inventory, nodes the chain expands to, aliases written, recursive)."""
    levels, width = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    merge, recursive, flow = draw(st.booleans()), draw(st.booleans()), draw(st.booleans())
    lines, size, sizes = ["a0: &a0 {k0: lol}" if merge else "a0: &a0 lol"], 3 if merge else 1, []
    sizes.append(size)
    for n in range(1, levels + 1):
        refs = [f"*a{n - 1}"] * width
        if merge:  # a mapping merging the level below `width` times, plus one key of its own
            lines.append(f"a{n}: &a{n} {{<<: [{', '.join(refs)}], k{n}: v}}")
            size = 1 + 1 + 1 + width * size + 2
        elif flow:
            lines.append(f"a{n}: &a{n} [{', '.join(refs)}]")
            size = 1 + width * size
        else:
            lines.append(f"a{n}: &a{n}\n" + "".join(f"  - {r}\n" for r in refs).rstrip("\n"))
            size = 1 + width * size
        sizes.append(size)
    # BASE and facts.bomb are 11 nodes; each level is a key and its value, each alias counted at full size.
    nodes = 11 + sum(1 + s for s in sizes)
    if recursive:  # r's key and sequence, then a whole last level before the alias to r itself
        lines.append(f"r: &r [*a{levels}, *r]")
        nodes += 2 + sizes[-1]
    return under_facts("\n".join(lines), "bomb"), nodes, levels * width + recursive * 2, recursive


@settings(FUZZ, max_examples=60)
@given(bomb=alias_bombs())
def test_fuzz_alias_bombs(tmp_path, bomb):
    text, nodes, aliases, recursive = bomb
    refused = check(tmp_path, text.encode())
    limits = ("(MAX_NODES)", "(MAX_ALIASES)")
    if recursive:
        assert refused is not None
        expected = ("recursive alias",) if nodes <= MAX_NODES and aliases <= MAX_ALIASES else (*limits, "recursive")
        assert any(fragment in refused.message for fragment in expected), refused
    elif nodes > MAX_NODES or aliases > MAX_ALIASES:
        assert refused is not None and any(fragment in refused.message for fragment in limits), refused
    else:
        assert refused is None, str(refused)


# ---- deep nesting ------------------------------------------------------------------------------

def _deep(style: str, depth: int) -> str:
    if style == "flow-sequence":
        return "[" * depth + "]" * depth
    if style == "flow-mapping":
        return "{a: " * depth + "x" + "}" * depth
    if style == "flow-mixed":
        return "[{a: " * (depth // 2) + "[x]" + "}]" * (depth // 2)
    if style == "flow-unclosed":
        return "[" * depth
    if style == "block-mapping":
        return "\n".join("  " * i + f"k{i}:" for i in range(depth - 1)) + "\n" + "  " * (depth - 1) + "k: x"
    if style == "block-sequence":
        return "- " * depth + "x"
    raise AssertionError(style)


@settings(FUZZ, max_examples=60)
@example(style="flow-unclosed", depth=63)  # refused for its depth before its missing "]" is seen
@example(style="flow-unclosed", depth=62)  # refused for the missing "]"
@given(style=st.sampled_from(["flow-sequence", "flow-mapping", "flow-mixed", "flow-unclosed", "block-mapping",
                              "block-sequence"]),
       depth=st.one_of(st.integers(1, 80), st.integers(80, 400), st.integers(400, 12_000)))
def test_fuzz_deep_nesting(tmp_path, style, depth):
    if style.startswith("block"):
        depth = min(depth, 400)  # 2 spaces a level: 400 levels is already 160 KiB of indentation
    refused = check(tmp_path, under_facts(_deep(style, depth), "deep").encode())
    # facts.deep sits two levels down (the document, facts): MAX_DEPTH counts from the document.
    if depth + 3 > MAX_DEPTH + 2:
        assert refused is not None and "(MAX_DEPTH)" in refused.message, refused
    elif style == "flow-unclosed" and depth + 2 > MAX_DEPTH:
        # The depth limit comes before the stream's end: the 63rd "[" under facts.deep is level 65.
        assert refused is not None and "(MAX_DEPTH)" in refused.message, refused
    elif style == "flow-unclosed":
        assert refused is not None and refused.message.startswith("invalid YAML"), refused
    elif depth + 3 <= MAX_DEPTH:
        assert refused is None, str(refused)


# ---- tags --------------------------------------------------------------------------------------

TAGS = ["!!python/object/apply:os.system", "!!python/object:os.system", "!!python/name:os.system",
        "!!python/tuple", "!!binary", "!!str", "!!int", "!!float", "!!bool", "!!null", "!!timestamp", "!!map",
        "!!seq", "!!set", "!!omap", "!!pairs", "!!merge", "!!value", "!custom", "!", "!<tag:yaml.org,2002:str>",
        "!<tag:example.com,2000:x>", "!e!x", "!!python/module:os", "!<!>"]
TAG_PLACES = {
    "name": lambda tag, v: f"name: {tag} {v}\ntelemetry: {{prometheus: x}}\n",
    "fact": lambda tag, v: BASE + f"facts:\n  x: {tag} {v}\n",
    "flow-value": lambda tag, v: BASE + f"facts: {{x: [1, {{y: {tag} {v}}}]}}\n",
    "key": lambda tag, v: BASE + f"facts:\n  {tag} k: {v}\n",
    "mapping": lambda tag, v: BASE + f"hosts: {tag}\n  h: {{address: {v}}}\n",
    "sequence-item": lambda tag, v: BASE + f"ports:\n  consul:\n    - 8500\n    - {tag} {v}\n",
    "document": lambda tag, v: f"--- {tag}\n" + BASE,
    "anchored": lambda tag, v: BASE + f"facts:\n  x: &a {tag} {v}\n  y: *a\n",
    "directive": lambda tag, v: "%TAG !e! tag:example.com,2000:\n---\n" + BASE + f"facts: {{x: {tag} {v}}}\n",
    "executor": lambda tag, v: BASE + f"hosts:\n  h:\n    address: a\n    executor:\n      kind: {tag} {v}\n",
}


@settings(FUZZ, max_examples=80)
@given(tag=st.sampled_from(TAGS), value=st.sampled_from(["x", "'1'", "[1, 2]", "{a: b}", "aGk=", "''", "ssh"]),
       place=st.sampled_from(sorted(TAG_PLACES)))
def test_fuzz_tags_are_refused(tmp_path, tag, value, place):
    refused = check(tmp_path, TAG_PLACES[place](tag, value).encode())
    assert refused is not None  # a tag is never read, wherever it stands
    if place in ("name", "fact", "flow-value", "sequence-item", "anchored", "executor") and not tag.startswith("!e!"):
        assert "is not allowed" in refused.message, refused.message


# ---- binary, invalid UTF-8, control characters ---------------------------------------------------

INVALID_UTF8 = [b"\xff", b"\xfe", b"\x80", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                b"\xe2\x82", b"caf\xe9", b"\xf8\x88\x80\x80\x80"]
BOMS = [b"\xff\xfe", b"\xfe\xff", b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff"]


@settings(FUZZ, max_examples=100)
@given(seed=st.sampled_from(SEEDS), where=st.integers(0, 1 << 16),
       chunk=st.one_of(st.binary(min_size=1, max_size=64), st.sampled_from(INVALID_UTF8 + BOMS + [b"\x00"]),
                       st.builds(bytes.__add__, st.sampled_from(INVALID_UTF8), st.binary(max_size=8))),
       at_start=st.booleans())
def test_fuzz_binary_and_invalid_utf8(tmp_path, seed, where, chunk, at_start):
    offset = 0 if at_start else where % (len(seed) + 1)
    data = seed[:offset] + chunk + seed[offset:]
    refused = check(tmp_path, data)
    if any(data.startswith(bom) for bom in BOMS):
        assert refused is not None and "byte-order mark" in refused.message, refused
    elif b"\x00" in data:
        assert refused is not None and refused.message.startswith(("binary content", "UTF-")), refused
        if refused.message.startswith("binary content"):
            assert refused.line == line_of(data, data.index(b"\x00")), (refused, data.index(b"\x00"))
    else:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            assert refused is not None and "not UTF-8 text" in refused.message, refused
            assert refused.line == line_of(data, exc.start), (str(refused), exc.start)


CONTROL = [chr(c) for c in [*range(1, 9), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F, *range(0x80, 0x85),
                            *range(0x86, 0xA0)]] + ["\ufffe", "\uffff"]


@settings(FUZZ, max_examples=40)
@given(seed=st.sampled_from(SEEDS), where=st.integers(0, 1 << 16), char=st.sampled_from(CONTROL))
def test_fuzz_control_characters(tmp_path, seed, where, char):
    offset = where % (len(seed) + 1)
    data = seed[:offset] + char.encode() + seed[offset:]
    refused = check(tmp_path, data)
    assert refused is not None and "control character" in refused.message, refused
    assert (refused.line, refused.message) == (line_of(data, offset), f"control character {char!r}: the file must be text")


# ---- duplicate keys at depth -------------------------------------------------------------------

# Pairs of keys that read as the same key (PyYAML's YAML 1.1 scalars), and so are duplicates.
SAME_KEYS = [("a", "a"), ("a", "'a'"), ("'a'", '"a"'), ('"a"', '"\\x61"'), ("1", "0x1"), ("1", "1.0"),
             ("15", "017"), ("1000", "1_000"), ("yes", "true"), ("True", "on"), ("~", "null"), ("0", "false"),
             ("2001-12-14", "2001-12-14"), (".inf", ".Inf"), ("address", "address")]


@st.composite
def duplicate_documents(draw: st.DrawFn) -> tuple[str, int, int, bool]:
    """(inventory, line and column of the second key, whether it is a duplicate: a key that only
    overrides one from a `<<` merge is not)."""
    depth = draw(st.integers(0, MAX_DEPTH - 10))
    first, second = draw(st.sampled_from(SAME_KEYS))
    flow, merge = draw(st.booleans()), draw(st.sampled_from(["none", "override", "repeat"]))
    containers = draw(st.lists(st.booleans(), min_size=depth, max_size=depth))  # True: a mapping level
    head = BASE + "facts:\n" + (f"  base: &base {{{first}: 0}}\n" if merge != "none" else "")
    merged = "<<: *base, " if merge != "none" else ""
    if flow:
        opening = "".join("{m: " if is_map else "[" for is_map in containers)
        closing = "".join("}" if is_map else "]" for is_map in reversed(containers))
        prefix = f"  deep: {opening}{{{merged}" + ("" if merge == "override" else f"{first}: 1, ")
        text = head + prefix
        offset = len(text)
        text += f"{second}: 2}}{closing}\n"
    else:
        text = head + "  deep:\n"
        indent = "    "
        for is_map in containers:
            text += indent + ("m:\n" if is_map else "-\n")
            indent += "  "
        if merge != "none":
            text += f"{indent}<<: *base\n"
        if merge != "override":
            text += f"{indent}{first}: 1\n"
        text += indent
        offset = len(text)
        text += f"{second}: 2\n"
    line = text.count("\n", 0, offset) + 1
    return text, line, offset - text.rfind("\n", 0, offset), merge != "override"


@settings(FUZZ, max_examples=80)
@given(doc=duplicate_documents())
def test_fuzz_duplicate_keys_at_depth(tmp_path, doc):
    text, line, column, duplicate = doc
    refused = check(tmp_path, text.encode())
    if duplicate:
        assert refused is not None and refused.message.startswith("duplicate key"), (refused, text)
        assert (refused.line, refused.column) == (line, column), (str(refused), line, column, text)
    else:
        assert refused is None, (str(refused), text)


# ---- huge lines and files ----------------------------------------------------------------------

@settings(FUZZ, max_examples=40)
@given(char=st.sampled_from(["x", "\u00e9", "\u20ac", "\U0001d11e"]),
       size=st.one_of(st.integers(MAX_LINE_BYTES - 24, MAX_LINE_BYTES + 8), st.integers(1, 4 << 20)),
       place=st.sampled_from(["quoted", "plain", "comment", "block-scalar", "key", "lines"]))
@example(char="x", size=1_400_000, place="lines")  # under the file limit, over the node limit
def test_fuzz_huge_lines_and_files(tmp_path, char, size, place):
    width = len(char.encode())
    body = char * (size // width)
    if place == "quoted":
        line = f"  x: '{body}'"
    elif place == "plain":
        line = f"  x: {body}"
    elif place == "comment":
        line = f"  a: 1\n# {body}"  # facts keeps an entry: a comment alone would leave it null
    elif place == "block-scalar":
        line = f"  x: |\n    {body}"
    elif place == "key":
        line = f"  {body}: x"
    else:  # many lines of a normal length, together over the file limit or not
        line = "\n".join(f"  k{i}: {char * 40}" for i in range(size // (44 + width * 40) + 1))
    data = (BASE + "facts:\n" + line + "\n").encode()
    refused = check(tmp_path, data)
    longest = max(len(each) for each in data.split(b"\n"))
    if len(data) > MAX_FILE_BYTES:
        assert refused is not None and "(MAX_FILE_BYTES)" in refused.message and refused.line == 1, refused
    elif longest > MAX_LINE_BYTES:
        assert refused is not None and "(MAX_LINE_BYTES)" in refused.message, refused
        assert refused.line == next(n for n, each in enumerate(data.split(b"\n"), 1) if len(each) > MAX_LINE_BYTES)
    elif place == "lines" and BASE_NODES + 2 * data.count(b"\n  k") > MAX_NODES:  # a key and a value a line
        assert refused is not None and "(MAX_NODES)" in refused.message, refused
    elif place != "key":  # a plain key over 1024 characters is invalid YAML (a located refusal)
        assert refused is None, str(refused)


# ---- random mutations of the real inventories --------------------------------------------------

SNIPPETS = [b"&a ", b"*a", b"<<: ", b"<<: *a", b"!", b"!!", b"{", b"}", b"[", b"]", b"- ", b": ", b"? ", b"|",
            b">", b"%", b"---\n", b"...\n", b"\t", b'"', b"'", b"#", b",", b"\n", b"\n  ", b"\r", b"\r\n",
            b"&", b"*", b"@", b"`", b"\xef\xbb\xbf", b"\xc2\x85", b"\\", b"~", b"null", b"0x", b"-.inf", b"=",
            b"name:", b"telemetry:", b"facts: &a {x: *a}", b"hosts: {h: {address: a}}"]


@st.composite
def mutations(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["delete", "duplicate", "insert", "snippet", "byte", "swap-lines", "indent",
                                   "truncate"]))
        at = draw(st.integers(0, 1 << 16)) % (len(data) + 1)
        if op == "delete":
            del data[at:at + draw(st.integers(1, 40))]
        elif op == "duplicate":
            chunk = data[at:at + draw(st.integers(1, 80))]
            data[at:at] = chunk * draw(st.integers(1, 3))
        elif op == "insert":
            data[at:at] = draw(st.one_of(st.binary(min_size=1, max_size=12),
                                         st.text(min_size=1, max_size=12).map(lambda t: t.encode("utf-8", "replace"))))
        elif op == "snippet":
            data[at:at] = draw(st.sampled_from(SNIPPETS))
        elif op == "byte" and data:
            data[at % len(data)] = draw(st.integers(0, 255))
        elif op in ("swap-lines", "indent"):
            lines = bytes(data).split(b"\n")
            i, j = at % len(lines), draw(st.integers(0, 1 << 16)) % len(lines)
            if op == "swap-lines":
                lines[i], lines[j] = lines[j], lines[i]
            else:
                lines[i] = b" " * draw(st.integers(0, 9)) + lines[i].lstrip(b" ")
            data = bytearray(b"\n".join(lines))
        elif op == "truncate":
            del data[at:]
    return bytes(data)


@settings(FUZZ, max_examples=200)
@given(data=mutations())
# A lone CR is a line break to YAML: the error's line counts it (found by the fuzzer).
@example(data=b" This machine with only a local Prometheus: what `make drill`\r uses befo")
def test_fuzz_mutated_real_inventories(tmp_path, data):
    check(tmp_path, data)


def test_seeds_are_valid_inventories(tmp_path):
    assert len(SEEDS) >= 2
    for seed in SEEDS:
        inventory, refused = read_inventory(tmp_path, seed)
        assert refused is None and inventory is not None, refused
        again = write_inventory(inventory, tmp_path / "roundtrip" / "again.yaml")
        assert loader.read_inventory(again) == inventory  # what the lab writes reads back the same


# ---- the CLI -----------------------------------------------------------------------------------

def validate_with_target(directory: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[str]]:
    """Run `coldstart validate --target fuzz` through the CLI's own entry (cli.main._run, what the
    `coldstart` command runs) on the inventory in directory; its exit code and stderr lines."""
    import cli.main

    runbook = directory / "runbook.yaml"
    runbook.write_text(RUNBOOK)
    registry()  # loaded once, outside the timed part
    monkeypatch.setenv("COLDSTART_TARGETS", str(directory))
    monkeypatch.setattr(sys, "argv", ["coldstart", "validate", "--target", NAME, str(runbook)])
    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        code, raised = timed(cli.main._run)
    assert raised is None, repr(raised)
    lines = stderr.getvalue().strip().splitlines()
    assert code in (0, 2) and "Traceback" not in stderr.getvalue(), (code, lines[-20:])
    return code, lines


@settings(FUZZ, max_examples=40)
@given(data=st.one_of(mutations(), alias_bombs().map(lambda b: b[0].encode()),
                      st.builds(lambda s, d: under_facts(_deep(s, d), "deep").encode(),
                                st.sampled_from(["flow-sequence", "flow-mapping"]), st.integers(1, 3000)),
                      st.builds(lambda t, p: TAG_PLACES[p](t, "x").encode(), st.sampled_from(TAGS),
                                st.sampled_from(sorted(TAG_PLACES))),
                      duplicate_documents().map(lambda d: d[0].encode())))
def test_fuzz_cli_validate_with_target(tmp_path, monkeypatch, data):
    """`coldstart validate --target fuzz`: exit 0, or 2 with one located line per problem (the
    inventory's refusal verbatim), never a traceback."""
    _read, refused = read_inventory(tmp_path, data)
    code, lines = validate_with_target(tmp_path, monkeypatch)
    if refused is not None:
        assert code == 2 and lines == refusal_lines(refused), (lines, refusal_lines(refused))
    elif code == 2:
        assert lines and all(LOCATED.match(line) for line in lines), lines


# ---- files that are not regular files ------------------------------------------------------------

@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_inventory_linked_to_a_device(tmp_path, device):
    (tmp_path / f"{NAME}.yaml").symlink_to(device)
    _, refused = timed(lambda: load_inventory(NAME, tmp_path))
    refused = assert_located(refused, tmp_path / f"{NAME}.yaml", b"")
    assert (refused.line, refused.column) == (1, 1) and "not a regular file" in refused.message


def test_inventory_that_is_a_fifo(tmp_path):
    os.mkfifo(tmp_path / f"{NAME}.yaml")
    with hard_limit(0.5):
        _, refused = timed(lambda: load_inventory(NAME, tmp_path))
    assert isinstance(refused, YamlRefused) and "not a regular file" in refused.message


# ---- gaps the fuzz found, fixed ------------------------------------------------------------------



@pytest.mark.parametrize("scalar", ["2001-13-01", "2001-02-30", "2001-12-14 25:00:00", "2001-12-14t21:59:43-99:00",
                                    "1" * 5000])
def test_unconstructible_scalars_are_refused_with_a_location(tmp_path, scalar):
    file = tmp_path / f"{NAME}.yaml"
    file.write_text(BASE + f"facts:\n  when: {scalar}\n")
    for read in (lambda: load_inventory(NAME, tmp_path), lambda: loader.read_inventory(file)):
        _, raised = timed(read)
        assert isinstance(raised, YamlRefused), repr(raised)[:200]
        assert str(raised).startswith(f"{file}:4:9: "), str(raised)


@pytest.mark.parametrize("name", ["[1, 2]", "", "7", "{a: b}"])
def test_inventory_name_that_is_not_a_string(tmp_path, name):
    (tmp_path / f"{NAME}.yaml").write_text(f"name: {name}\ntelemetry: {{prometheus: x}}\n")
    runbook = tmp_path / "runbook.yaml"
    runbook.write_text(RUNBOOK)
    _, raised = timed(lambda: plan_run(runbook, registry=registry(), targets_dir=tmp_path, placeholders=True))
    assert isinstance(raised, RunbookInvalid), repr(raised)[:200]
    assert all(LOCATED.match(line) for line in raised.errors), raised.errors


def test_cli_prints_a_refusal_verbatim(tmp_path, monkeypatch):
    data = b'name: fuzz\n":thumbs_up:": 1\n":thumbs_up:": 2\n'
    _, refused = read_inventory(tmp_path, data)
    assert isinstance(refused, YamlRefused) and refused.message == "duplicate key ':thumbs_up:'"
    code, lines = validate_with_target(tmp_path, monkeypatch)
    assert code == 2 and lines == [str(refused)], lines

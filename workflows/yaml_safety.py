"""Guarded YAML reading for runbooks and inventories: hostile files are refused with a location, never expanded."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Hashable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
import yaml.parser
import yaml.reader
import yaml.scanner
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent, CollectionStartEvent, NodeEvent, ScalarEvent
from yaml.resolver import Resolver

from activities.errors import LocatedErrors

__all__ = [
    "MAX_ALIASES",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_LINE_BYTES",
    "MAX_NODES",
    "GuardedLoader",
    "PythonGuardedLoader",
    "YamlRefused",
    "as_refusal",
    "check_text",
    "load_file",
    "load_text",
    "read_text",
]

# The bundled runbooks are at most 13 KiB, 770 nodes, 7 levels, 3 aliases and 161-byte lines, and
# the inventories are smaller: every limit is 9 to 400 times that, and all of them together keep a
# refusal (or a read that passes) well under a second and a few MiB; 20,000 nodes is the most a
# runbook can hold and still be planned in about a second.
MAX_FILE_BYTES = 1 << 20  # 1 MiB
MAX_LINE_BYTES = 64 << 10  # 64 KiB
MAX_DEPTH = 64  # nested collections
MAX_NODES = 20_000  # scalars and collections, each alias counted as the whole node it repeats
MAX_ALIASES = 1_000

_CORE_TAGS = "tag:yaml.org,2002:"
_MERGE_TAG = _CORE_TAGS + "merge"
_NON_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_DEEP = f"nested more than {MAX_DEPTH} levels deep (MAX_DEPTH)"
_BOMS = {
    b"\x00\x00\xfe\xff": "UTF-32",
    b"\xff\xfe\x00\x00": "UTF-32",
    b"\xfe\xff": "UTF-16",
    b"\xff\xfe": "UTF-16",
}


class YamlRefused(LocatedErrors):
    """A file refused before or while it was read: where (1-based line and column) and why (one located error).

    A ValueError, so callers that already catch a malformed file's ValueError catch this too.
    """

    def __init__(self, line: int, column: int, message: str, file: str | None = None):
        self.line, self.column, self.message, self.file = line, column, message, file
        super().__init__([self.located(file) if file else f"{line}:{column}: {message}"])

    def located(self, file: str) -> str:
        return f"{file}:{self.line}:{self.column}: {self.message}"


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{n} bytes"


def _position(data: bytes, offset: int) -> tuple[int, int]:
    """1-based line and column (in characters) of a byte offset."""
    start = data.rfind(b"\n", 0, offset) + 1
    column = len(data[start:offset].decode("utf-8", errors="replace"))
    return data.count(b"\n", 0, offset) + 1, column + 1


def read_text(path: str | Path) -> str:
    """The file's text, checked like check_text; the size is checked before the file is read."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise YamlRefused(1, 1, "not a regular file (a pipe, device or directory): give a YAML file")
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > MAX_FILE_BYTES:
            raise YamlRefused(1, 1, _too_big(size))
        data = fh.read(MAX_FILE_BYTES + 1)
    return _check_bytes(data)


def _too_big(size: int | None, what: str = "file") -> str:
    measured = f"{what} is {_size(size)}" if size is not None else f"{what} is larger"
    return f"{measured}, over the {_size(MAX_FILE_BYTES)} limit (MAX_FILE_BYTES)"


def _check_bytes(data: bytes) -> str:
    if len(data) > MAX_FILE_BYTES:
        raise YamlRefused(1, 1, _too_big(None))  # a pipe or device: no size to stat
    for bom, encoding in _BOMS.items():
        if data.startswith(bom):
            raise YamlRefused(1, 1, f"{encoding} byte-order mark: the file must be UTF-8 text")
    nul = data.find(b"\0")
    if nul >= 0:
        raise YamlRefused(*_position(data, nul), "binary content (a NUL byte): the file must be UTF-8 text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlRefused(*_position(data, exc.start), f"not UTF-8 text (byte 0x{data[exc.start]:02x})") from None
    return _check_lines(data, text)


def _check_lines(data: bytes, text: str) -> str:
    for number, line in enumerate(data.split(b"\n"), 1):
        if len(line) > MAX_LINE_BYTES:
            limit = _size(MAX_LINE_BYTES)
            raise YamlRefused(number, 1, f"line is {_size(len(line))}, over the {limit} limit (MAX_LINE_BYTES)")
    bad = _NON_PRINTABLE.search(text)
    if bad:
        offset = len(text[: bad.start()].encode("utf-8"))
        raise YamlRefused(*_position(data, offset), f"control character {bad.group()!r}: the file must be text")
    return text.removeprefix("\ufeff")


def check_text(text: str) -> str:
    """Apply the file checks to text already in memory (size, lines, characters)."""
    if len(text) > MAX_FILE_BYTES:  # at least as many bytes: refuse before encoding it all
        raise YamlRefused(1, 1, _too_big(None, "text"))
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates
        line, column = text.count("\n", 0, exc.start) + 1, exc.start - text.rfind("\n", 0, exc.start)
        raise YamlRefused(line, column, "not UTF-8 text (a lone surrogate)") from None
    if len(data) > MAX_FILE_BYTES:
        raise YamlRefused(1, 1, _too_big(len(data), "text"))
    return _check_bytes(data)


def _refuse(mark: yaml.Mark, message: str) -> YamlRefused:
    return YamlRefused(mark.line + 1, mark.column + 1, message)


class _Guards(Composer, SafeConstructor, Resolver):
    """Counts while composing: depth, nodes (aliases at full size), aliases; refuses tags and duplicate keys.

    Composition only links an alias to its anchor, so a bomb is refused here, before anything expands
    it. Constructing a mapping refuses a key written twice in it (one from a `<<` merge may be overridden).
    """

    def __init__(self) -> None:
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._depth = 0
        self._nodes = 0
        self._aliases = 0
        self._sizes: dict[int, int] = {}  # id(anchored node) -> its expanded size, once complete

    if TYPE_CHECKING:
        # The parser's, in the loaders below (the pure-Python one or libyaml's).
        def peek_event(self) -> yaml.Event | None: ...

    def compose_node(self, parent: Any, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        assert isinstance(event, NodeEvent)  # the composer asks for a node only at a node's event
        if isinstance(event, AliasEvent):
            self._count_alias(event)
            return super().compose_node(parent, index)
        if isinstance(event, (ScalarEvent, CollectionStartEvent)) and event.tag is not None:
            tag = "!!" + event.tag.removeprefix(_CORE_TAGS) if event.tag.startswith(_CORE_TAGS) else event.tag
            raise _refuse(event.start_mark, f"tag {tag} is not allowed: write plain YAML values, without tags")
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _refuse(event.start_mark, _DEEP)
        self._add_nodes(1, event.start_mark)
        start = self._nodes
        node = super().compose_node(parent, index)
        self._depth -= 1
        if event.anchor is not None:
            self._sizes[id(node)] = self._nodes - start + 1
        return node

    def _count_alias(self, event: AliasEvent) -> None:
        self._aliases += 1
        if self._aliases > MAX_ALIASES:
            raise _refuse(event.start_mark, f"more than {MAX_ALIASES} aliases (MAX_ALIASES)")
        target = self.anchors.get(event.anchor)
        if target is None:
            return  # the composer reports the undefined alias
        size = self._sizes.get(id(target))
        if size is None:
            message = f"alias *{event.anchor} refers to a node that contains it (recursive alias)"
            raise _refuse(event.start_mark, message)
        self._add_nodes(size, event.start_mark)

    def _add_nodes(self, count: int, mark: yaml.Mark) -> None:
        self._nodes += count
        if self._nodes > MAX_NODES:
            raise _refuse(mark, f"more than {MAX_NODES} nodes, counting what aliases repeat (MAX_NODES)")

    def mapping_items(self, node: yaml.MappingNode) -> list[tuple[yaml.Node, yaml.Node, bool]]:
        """(key, value, written here) for each entry, `<<` merges expanded first without changing the node."""
        merged: list[tuple[yaml.Node, yaml.Node, bool]] = []
        own: list[tuple[yaml.Node, yaml.Node, bool]] = []
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE_TAG:
                own.append((key_node, value_node, True))
                continue
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for source in reversed(sources):  # the first mapping listed wins, as in PyYAML
                if not isinstance(source, yaml.MappingNode):
                    raise _refuse(source.start_mark, "a merge (<<) takes a mapping or a list of mappings")
                merged.extend((k, v, False) for k, v, _ in self.mapping_items(source))
        return merged + own

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except YamlRefused:
            raise
        except (ValueError, OverflowError) as exc:  # an impossible date, an integer past Python's digit limit
            shown = node.value if isinstance(node.value, str) else node.tag
            shown = shown if len(shown) <= 40 else shown[:40] + "..."
            reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
            raise _refuse(node.start_mark, f"cannot read {shown!r}: {reason}") from None

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):
            # PyYAML raises its usual error for a node that is no mapping (its stub takes only mappings).
            return super().construct_mapping(node, deep=deep)  # pyright: ignore[reportArgumentType]
        mapping: dict[Any, Any] = {}
        written: set[Any] = set()
        for key_node, value_node, own in self.mapping_items(node):
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                raise _refuse(key_node.start_mark, "a mapping key must be a plain scalar")
            if own:
                if key in written:
                    raise _refuse(key_node.start_mark, f"duplicate key {key!r}")
                written.add(key)
            mapping[key] = self.construct_object(value_node, deep=deep)
        return mapping


class _PythonEvents(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):
    """PyYAML's pure-Python parser, refusing deep flow nesting as it scans: its look-ahead for a
    possible key costs time with the square of the depth, before the composer sees any of it."""

    def __init__(self, stream: str):
        yaml.reader.Reader.__init__(self, stream)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)

    def fetch_flow_collection_start(self, TokenClass: type) -> None:
        if self.flow_level >= MAX_DEPTH:
            raise _refuse(self.get_mark(), _DEEP)
        super().fetch_flow_collection_start(TokenClass)


class PythonGuardedLoader(_Guards, _PythonEvents):
    """The guarded loader on the pure-Python parser: slower; used where PyYAML has no libyaml."""

    def __init__(self, stream: str):
        _PythonEvents.__init__(self, stream)
        _Guards.__init__(self)


try:
    from yaml._yaml import CParser
except ImportError:  # PyYAML built without libyaml
    # The same guards on the other parser: a type checker sees the libyaml loader's class below.
    GuardedLoader = PythonGuardedLoader  # pyright: ignore[reportAssignmentType]
else:

    class GuardedLoader(_Guards, CParser):  # type: ignore[no-redef]
        """The guarded loader on libyaml's parser: fast, and its events keep line and column."""

        def __init__(self, stream: str):
            CParser.__init__(self, stream)
            _Guards.__init__(self)


def as_refusal(exc: yaml.YAMLError, text: str) -> YamlRefused:
    """A PyYAML error as a located refusal."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        return YamlRefused(line, column, f"invalid YAML: {exc.problem or exc.context or 'syntax error'}")
    if isinstance(exc, yaml.reader.ReaderError):
        pos = exc.position
        return YamlRefused(text.count("\n", 0, pos) + 1, pos - text.rfind("\n", 0, pos),
                           f"invalid YAML: character {exc.character!r} is not allowed")
    return YamlRefused(1, 1, f"invalid YAML: {' '.join(str(exc).split())}")


def _load(text: str) -> Any:
    loader = GuardedLoader(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise as_refusal(exc, text) from None
    finally:
        loader.dispose()


def load_text(text: str) -> Any:
    """Checked, guarded yaml.safe_load of one document; raises YamlRefused for every problem."""
    return _load(check_text(text))


def load_file(path: str | Path) -> Any:
    """Guarded yaml.safe_load of a file read with read_text; its YamlRefused names the file."""
    try:
        return _load(read_text(path))
    except YamlRefused as exc:
        raise YamlRefused(exc.line, exc.column, exc.message, str(path)) from None

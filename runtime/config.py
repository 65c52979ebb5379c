"""One configuration file for the CLI and the worker: a TOML file of sections, each setting mapped to the
environment variable every reader already reads.

Which file: `coldstart --config PATH`, else `$COLDSTART_CONFIG`, else /etc/coldstart/coldstart.toml when it
exists, else none (`python worker.py` has no option: the variable or the default path). A named file that
does not exist is an error; the default path missing is not.

Precedence: the environment variable, else the file, else the default. The file is applied once, at the
CLI's root command and at the worker's entry, as environment defaults: each setting it gives is set with
`os.environ.setdefault(VARIABLE, value)`, in the form the variable takes. Every reader keeps reading its one
variable (one source of truth, unchanged), and a variable set in the environment is never overridden.

Every problem in a file (TOML syntax, an unknown section or key, a wrong type, a secret given as a literal)
is a LocatedErrors, one `file:line:col: message` line each, which the CLI prints and exits 2 on. tomllib
gives no positions but for syntax errors, so a key is found by scanning the text: its `[section]` header,
then the `key =` line within it (a dotted key or inline table falls back to where its section is named).

A secret (SECRET in the table) is given only as a reference, `{ env = "NAME" }` or `{ file = "/path" }`,
never its value: a file is read by several people and kept in version control, the secret is not.
The reference is resolved when the file is applied (and only when the variable is unset; one that cannot
be resolved stops the worker and is a warning in the CLI); `coldstart config` prints the reference, never
the value.

Not settings, so not in the table (EXCLUDED names those the controller's code mentions):
COLDSTART_CONFIG names the file itself; COLDSTART_TEMPORAL_DB_PASSWORD is what `coldstart server` hands the
Temporal server it starts (a password it generates), never read from the environment. The test suite's and
the drill lab's variables (COLDSTART_TEST_*, COLDSTART_LAB_STATE, COLDSTART_STANDINS, COLDSTART_DRILL_BACKENDS)
and the install scripts' (COLDSTART_TEMPORAL_CACHE, COLDSTART_PULUMI_SHARED) configure no deployment; a
notification sink's `secret_env` and VAULT_TOKEN / VAULT_PASSWORD name per-use credentials, kept out of files.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from activities.errors import LocatedErrors

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_PATH",
    "EXCLUDED",
    "SETTINGS",
    "Config",
    "FileValue",
    "Row",
    "SecretRef",
    "Setting",
    "apply",
    "effective",
    "load",
]

CONFIG_ENV = "COLDSTART_CONFIG"
DEFAULT_PATH = Path("/etc/coldstart/coldstart.toml")

Kind = Literal["str", "path", "int", "float"]
_KIND_WORDS: dict[str, str] = {"str": "a string", "path": "a path (a string)", "int": "an integer",
                               "float": "a number"}


@dataclass(frozen=True)
class Setting:
    """One setting: where it sits in the file, the variable it maps to, its type and its default.

    default: the value used when neither the environment nor the file sets it; None when there is none
    (unset) or the reader computes it, as `default_note` says."""

    section: str
    key: str
    env: str
    kind: Kind
    default: str | int | float | None
    description: str
    secret: bool = False
    default_note: str = "(unset)"

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}"

    @property
    def default_text(self) -> str:
        return self.default_note if self.default is None else str(self.default)


SETTINGS: tuple[Setting, ...] = (
    Setting("temporal", "address", "TEMPORAL_ADDRESS", "str", "localhost:7233", "the Temporal frontend, host:port"),
    Setting("temporal", "namespace", "TEMPORAL_NAMESPACE", "str", "default", "the Temporal namespace"),
    Setting("temporal", "profile", "TEMPORAL_PROFILE", "str", None,
            "the temporalio.envconfig profile to use", default_note="(unset: the profile named default)"),
    Setting("temporal", "api_key", "TEMPORAL_API_KEY", "str", None,
            "the API key sent to Temporal (Temporal Cloud); turns TLS on", secret=True),
    Setting("temporal", "task_queue", "COLDSTART_TASK_QUEUE", "str", "coldstart",
            "the task queue the workers poll and the CLI starts runs on"),
    Setting("temporal", "web_ui", "COLDSTART_WEB_UI", "str", None, "the Temporal Web UI, host:port or a URL",
            default_note="(the frontend's host, port 8233)"),
    Setting("catalog", "runbooks", "COLDSTART_CATALOG", "path", "runbooks",
            "the directory of the runbooks a worker runs"),
    Setting("catalog", "targets", "COLDSTART_TARGETS", "path", "targets",
            "the directory of the inventories: NAME.yaml is target NAME"),
    Setting("worker", "metrics", "COLDSTART_METRICS", "str", "127.0.0.1:9464",
            "the worker's Prometheus metrics bind address, '' to disable"),
    Setting("worker", "deployment", "COLDSTART_DEPLOYMENT", "str", None,
            "the Worker Deployment the worker is a version of; runs are pinned to a version",
            default_note="(the task queue's name)"),
    Setting("worker", "action_journal", "COLDSTART_ACTION_JOURNAL", "path", None,
            "the action journal: a JSON line per action attempt's start and end"),
    Setting("worker", "note_journal", "COLDSTART_JOURNAL", "path", ".state/journal.jsonl",
            "the JSONL journal the `note` action writes to when its step names none"),
    Setting("worker", "seal_keys", "COLDSTART_SEAL_KEYS", "path", None,
            "the workers' sealing key file (made 0600 on a first start)",
            default_note="(~/.local/state/coldstart/seal-keys, under $XDG_STATE_HOME if set)"),
    Setting("worker", "notify", "COLDSTART_NOTIFY", "path", None,
            "the notifications file (YAML): where run and readiness events go"),
    Setting("worker", "readings_per_second", "COLDSTART_READINGS_PER_SECOND", "float", 10.0,
            "the gate readings a worker takes a second"),
    Setting("worker", "readings_share", "COLDSTART_READINGS_SHARE", "float", 0.25,
            "the part of that pace readings take while the worker runs steps, in (0, 1]"),
    Setting("readiness", "state", "COLDSTART_READINESS_STATE", "path", ".state/readiness.json",
            "where the last readiness of each runbook and target is kept"),
    Setting("readiness", "metrics_dir", "COLDSTART_READINESS_METRICS_DIR", "path", None,
            "node_exporter's textfile directory for scheduled checks' metrics"),
    Setting("readiness", "push", "COLDSTART_READINESS_PUSH", "str", None,
            "a Pushgateway URL (http or https) for scheduled checks' metrics"),
    Setting("logging", "level", "COLDSTART_LOG_LEVEL", "str", "INFO", "the worker's log level"),
    Setting("logging", "queue", "COLDSTART_LOG_QUEUE", "int", 10_000,
            "log records held for the writer before new ones are dropped"),
    Setting("logging", "sample", "COLDSTART_LOG_SAMPLE", "int", 100,
            "records of one kind a second kept in full (0: no sampling)"),
    Setting("cli", "user", "COLDSTART_USER", "str", None, "who the CLI acts as (approvals, starts)",
            default_note="(your login name)"),
)

# Variables the controller's code mentions that are no settings (see the module docstring).
EXCLUDED: dict[str, str] = {
    CONFIG_ENV: "names the configuration file itself",
    "COLDSTART_TEMPORAL_DB_PASSWORD": "handed by `coldstart server` to the Temporal server it starts, never read",
}

_BY_SECTION: dict[str, dict[str, Setting]] = {}
for _setting in SETTINGS:
    _BY_SECTION.setdefault(_setting.section, {})[_setting.key] = _setting


@dataclass(frozen=True)
class SecretRef:
    """Where a secret is: the variable `env` or the file `file` (exactly one)."""

    env: str | None = None
    file: str | None = None

    def __str__(self) -> str:
        return f'{{ env = "{self.env}" }}' if self.env is not None else f'{{ file = "{self.file}" }}'

    def resolve(self, environ: Mapping[str, str]) -> str | None:
        """The secret, or None when the variable is unset; OSError when the file cannot be read."""
        if self.env is not None:
            return environ.get(self.env)
        return Path(str(self.file)).read_text().strip()


@dataclass(frozen=True)
class FileValue:
    """A setting the file gives, and the line it is on."""

    setting: Setting
    value: str | int | float | SecretRef
    line: int
    col: int


@dataclass(frozen=True)
class Config:
    """A loaded configuration file (path None: there is none), its settings by variable name."""

    path: Path | None
    values: dict[str, FileValue]


@dataclass(frozen=True)
class Row:
    """One setting's effective value: `value` is what may be shown (a secret's reference, never the secret)."""

    setting: Setting
    value: str
    source: Literal["environment", "file", "default"]
    where: str  # the variable, FILE:LINE, or ""

    @property
    def source_text(self) -> str:
        return self.source if self.source == "default" else f"{self.source} {self.where}"


def _config_path(option: Path | None, environ: Mapping[str, str], default: Path) -> Path | None:
    """The file to read, None for none; LocatedErrors when a named one (option, variable) does not exist."""
    by, named = ("--config", option) if option is not None else (f"${CONFIG_ENV}", environ.get(CONFIG_ENV) or None)
    if named is None:
        return default if default.is_file() else None
    path = Path(named)
    if not path.exists():
        raise LocatedErrors([f"{path}:1:1: the configuration file {path} does not exist (named by {by})"])
    return path


def load(option: Path | None = None, environ: Mapping[str, str] = os.environ, *,
         default: Path = DEFAULT_PATH) -> Config:
    """Find, read and check the configuration file; LocatedErrors listing every problem."""
    path = _config_path(option, environ, default)
    if path is None:
        return Config(None, {})
    try:
        text = path.read_bytes().decode()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise LocatedErrors([f"{path}:1:1: cannot read the configuration file: {reason}"]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LocatedErrors([_syntax_error(path, text, str(exc))]) from None
    errors: list[str] = []
    values: dict[str, FileValue] = {}
    lines = text.splitlines()
    for section, table in data.items():
        where = _locate(lines, section)
        if section not in _BY_SECTION:
            errors.append(f"{path}:{where[0]}:{where[1]}: unknown section [{section}] (known: {', '.join(_BY_SECTION)})")
            continue
        if not isinstance(table, dict):
            errors.append(f"{path}:{where[0]}:{where[1]}: [{section}] must be a table of settings, not {_what(table)}")
            continue
        known = _BY_SECTION[section]
        for key, raw in table.items():
            line, col = _locate(lines, section, key)
            setting = known.get(key)
            if setting is None:
                errors.append(f"{path}:{line}:{col}: unknown key '{key}' in [{section}] (known: {', '.join(known)})")
                continue
            value, problem = _checked(setting, raw)
            if problem:
                errors.append(f"{path}:{line}:{col}: {problem}")
            elif value is not None:
                values[setting.env] = FileValue(setting, value, line, col)
    if errors:
        raise LocatedErrors(errors)
    return Config(path, values)


def apply(config: Config, environ: MutableMapping[str, str] = os.environ) -> list[str]:
    """Set each variable the file gives and the environment does not, a secret's reference resolved then.

    Returns the references that could not be resolved (`file:line:col: message` each; their variables stay
    unset): the worker refuses to start on one, the CLI warns, as not every command needs every secret."""
    unresolved: list[str] = []
    for name, given in config.values.items():
        if name in environ:
            continue
        value = given.value
        if isinstance(value, SecretRef):
            at = f"{config.path}:{given.line}:{given.col}: {given.setting.name}"
            try:
                resolved = value.resolve(environ)
            except OSError as exc:
                unresolved.append(f"{at}: cannot read {value.file}: {exc.strerror or exc}")
                continue
            if resolved is None:
                unresolved.append(f"{at}: ${value.env} is not set")
                continue
            value = resolved
        environ[name] = str(value)
    return unresolved


def effective(config: Config, environ: Mapping[str, str]) -> list[Row]:
    """Every setting's value and where it comes from, given the environment before the file was applied."""
    rows: list[Row] = []
    for setting in SETTINGS:
        given = config.values.get(setting.env)
        if setting.env in environ:
            shown = "(set in environment)" if setting.secret else environ[setting.env]
            rows.append(Row(setting, shown, "environment", setting.env))
        elif given is not None:
            rows.append(Row(setting, str(given.value), "file", f"{config.path}:{given.line}"))
        else:
            rows.append(Row(setting, setting.default_text, "default", ""))
    return rows


def _checked(setting: Setting, raw: Any) -> tuple[str | int | float | SecretRef | None, str]:
    """The value in the setting's type, or a problem to report."""
    label = f"'{setting.key}' in [{setting.section}]"
    if setting.secret:
        if isinstance(raw, dict) and len(raw) == 1 and set(raw) <= {"env", "file"}:
            (form, target), = raw.items()
            if isinstance(target, str) and target:
                return (SecretRef(env=target) if form == "env" else SecretRef(file=target)), ""
        if isinstance(raw, str):
            return None, (f"{label} is a secret: a secret is given as a reference, not its value "
                          f'({setting.key} = {{ env = "NAME" }} or {{ file = "/path" }})')
        return None, f'{label} must be a reference, {{ env = "NAME" }} or {{ file = "/path" }}, not {_what(raw)}'
    if setting.kind in ("str", "path") and isinstance(raw, str):
        return raw, ""
    if setting.kind == "int" and isinstance(raw, int) and not isinstance(raw, bool):
        return raw, ""
    if setting.kind == "float" and isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw), ""
    return None, f"{label} must be {_KIND_WORDS[setting.kind]}, not {_what(raw)}"


def _what(value: Any) -> str:
    words = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
             dict: "a table"}
    return next((word for kind, word in words.items() if isinstance(value, kind)), "a date or time")


_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")
_AT_END = re.compile(r"\s*\(at end of document\)$")


def _syntax_error(path: Path, text: str, message: str) -> str:
    """tomllib's message with its "(at line L, column C)" turned into the file:line:col form."""
    if found := _AT.search(message):
        return f"{path}:{found[1]}:{found[2]}: {message[:found.start()]}"
    lines = text.splitlines() or [""]
    return f"{path}:{len(lines)}:{len(lines[-1]) + 1}: {_AT_END.sub('', message)}"


_HEADER = re.compile(r"\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")


def _unquoted(name: str) -> str:
    return ".".join(part.strip().strip("\"'") for part in name.split("."))


def _key_at(line: str, key: str) -> int | None:
    """The column where `key` is set on this line (`key =`, `"key" =`, `key.sub =`), else None."""
    found = re.match(rf"""(\s*)(["']?){re.escape(key)}\2\s*[=.]""", line)
    return len(found[1]) + 1 if found else None


def _locate(lines: list[str], section: str, key: str | None = None) -> tuple[int, int]:
    """Where the section (or its key) is named: 1-based line and column; the section's header when the key
    cannot be told apart, the file's start when neither can."""
    current: str | None = None
    named: tuple[int, int] | None = None
    for number, line in enumerate(lines, start=1):
        if header := _HEADER.match(line):
            current = _unquoted(header[1])
            spot = (number, line.index("[") + 1)
            if current == section:
                if key is None:
                    return spot
                named = named or spot
            elif key is not None and current == f"{section}.{key}":
                return spot
            continue
        # Within [section]: `key =`; before any header: the dotted `section.key =`.
        wanted = {section: key, None: f"{section}.{key}"}.get(current) if key is not None else None
        if wanted is not None and (col := _key_at(line, wanted)) is not None:
            return number, col
        if current is None and (col := _key_at(line, section)) is not None:
            if key is None:
                return number, col
            named = named or (number, col)
    return named or (1, 1)

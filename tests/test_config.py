"""The configuration file: located refusals (exit 2), precedence environment > file > default, secrets as
references only, the file's values reaching the readers, and the table covering every variable read."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from runtime.config import CONFIG_ENV, EXCLUDED, SETTINGS, apply, load

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "docs" / "coldstart.example.toml"
_OURS = {setting.env for setting in SETTINGS} | {CONFIG_ENV}


def cli(*args: str, **env_vars: str) -> subprocess.CompletedProcess[str]:
    """`coldstart ARGS` with none of the settings' variables inherited, only `env_vars`."""
    env = {name: value for name, value in os.environ.items() if name not in _OURS} | env_vars
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env=env, check=False)


def settings_json(*args: str, **env_vars: str) -> dict[str, dict]:
    done = cli(*args, "config", "--json", **env_vars)
    assert done.returncode == 0, done.stderr
    return {row["setting"]: row for row in json.loads(done.stdout)["settings"]}


@pytest.fixture
def write(tmp_path):
    def written(text: str, name: str = "coldstart.toml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path
    return written


def test_unknown_key_exits_2_with_its_location(write):
    path = write('[temporal]\naddress = "h:1"\n\n[catalog]\n  runbok = "x"\n')
    done = cli("--config", str(path), "config")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"{path}:5:3: unknown key 'runbok' in [catalog] (known: runbooks, targets)"]
    # The same file without the typo is accepted (the positive control).
    assert cli("--config", str(write('[catalog]\n  runbooks = "x"\n')), "config").returncode == 0


def test_unknown_section_and_wrong_types_are_each_located(write):
    path = write('[logging]\nqueue = "many"\nsample = 5\n\n[worker]\nreadings_share = true\n\n[nope]\na = 1\n')
    done = cli("config", COLDSTART_CONFIG=str(path))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"{path}:2:1: 'queue' in [logging] must be an integer, not a string",
        f"{path}:6:1: 'readings_share' in [worker] must be a number, not a boolean",
        f"{path}:8:1: unknown section [nope] (known: temporal, catalog, worker, readiness, logging, cli)",
    ]


def test_toml_syntax_error_is_located(write):
    path = write('[temporal]\naddress = "h:1"\nnamespace = \n')
    done = cli("--config", str(path), "config")
    assert (done.returncode, done.stderr.strip()) == (2, f"{path}:3:13: Invalid value")


@pytest.mark.parametrize("by", ["option", "variable"])
def test_a_named_file_that_is_missing_exits_2(tmp_path, by):
    missing = tmp_path / "absent.toml"
    done = (cli("--config", str(missing), "config") if by == "option"
            else cli("config", COLDSTART_CONFIG=str(missing)))
    assert done.returncode == 2
    named = "--config" if by == "option" else "$COLDSTART_CONFIG"
    assert done.stderr.strip() == f"{missing}:1:1: the configuration file {missing} does not exist (named by {named})"


def test_the_default_path_is_read_only_when_it_exists(tmp_path):
    default = tmp_path / "coldstart.toml"
    assert load(None, {}, default=default).path is None
    default.write_text('[catalog]\nrunbooks = "/srv/runbooks"\n')
    assert load(None, {}, default=default).values["COLDSTART_CATALOG"].value == "/srv/runbooks"


def test_environment_wins_over_file_over_default(write):
    path = write('[catalog]\nrunbooks = "/srv/runbooks"\ntargets = "/srv/targets"\n')
    rows = settings_json("--config", str(path), COLDSTART_TARGETS="/env/targets")
    assert (rows["catalog.targets"]["value"], rows["catalog.targets"]["source"],
            rows["catalog.targets"]["where"]) == ("/env/targets", "environment", "COLDSTART_TARGETS")
    assert (rows["catalog.runbooks"]["value"], rows["catalog.runbooks"]["source"],
            rows["catalog.runbooks"]["where"]) == ("/srv/runbooks", "file", f"{path}:2")
    assert (rows["temporal.address"]["value"], rows["temporal.address"]["source"]) == ("localhost:7233", "default")
    text = cli("--config", str(path), "config", COLDSTART_TARGETS="/env/targets").stdout
    assert re.search(rf"^catalog\.runbooks +/srv/runbooks +file {re.escape(str(path))}:2$", text, re.MULTILINE)
    assert re.search(r"^catalog\.targets +/env/targets +environment COLDSTART_TARGETS$", text, re.MULTILINE)


def test_a_secret_given_as_its_value_is_refused(write):
    path = write('[temporal]\napi_key = "tok-123"\n')
    done = cli("--config", str(path), "config")
    assert done.returncode == 2
    assert done.stderr.startswith(f"{path}:2:1: 'api_key' in [temporal] is a secret: a secret is given as a "
                                  "reference, not its value")
    assert "tok-123" not in done.stderr


def test_a_secret_reference_is_shown_never_resolved(write, tmp_path):
    path = write('[temporal]\napi_key = { env = "CLOUD_KEY" }\n')
    rows = settings_json("--config", str(path), CLOUD_KEY="tok-123")
    assert (rows["temporal.api_key"]["value"], rows["temporal.api_key"]["source"]) == ('{ env = "CLOUD_KEY" }', "file")
    in_env = cli("--config", str(path), "config", TEMPORAL_API_KEY="tok-456")
    assert "tok-" not in in_env.stdout and "(set in environment)" in in_env.stdout
    key = tmp_path / "key"
    key.write_text("tok-789\n")
    shown = cli("--config", str(write(f'[temporal]\napi_key = {{ file = "{key}" }}\n', "by-file.toml")), "config")
    assert f'{{ file = "{key}" }}' in shown.stdout and "tok-" not in shown.stdout
    # Applied, the reference fills the variable the SDK reads.
    environ = {"CLOUD_KEY": "tok-123"}
    assert apply(load(path, environ), environ) == [] and environ["TEMPORAL_API_KEY"] == "tok-123"
    environ = {}
    assert apply(load(path, environ), environ) == [f"{path}:2:1: temporal.api_key: $CLOUD_KEY is not set"]
    assert "TEMPORAL_API_KEY" not in environ


def test_the_file_value_is_what_the_catalog_reader_sees(write):
    from runtime.catalog import Catalog
    from runtime.worker import reading_settings

    path = write('[catalog]\nrunbooks = "/srv/runbooks"\ntargets = "/srv/targets"\n\n[worker]\nreadings_share = 0.5\n')
    environ: dict[str, str] = {"COLDSTART_TARGETS": "/env/targets"}
    apply(load(path, environ), environ)
    catalog = Catalog.from_environment(environ)
    assert (catalog.runbooks_dir, catalog.targets_dir) == (Path("/srv/runbooks"), Path("/env/targets"))
    assert reading_settings(environ) == (10.0, 0.5)


def test_the_worker_entry_refuses_a_bad_file(write):
    path = write("[worker]\nmetrics = 9464\n")
    env = {name: value for name, value in os.environ.items() if name not in _OURS} | {CONFIG_ENV: str(path)}
    done = subprocess.run([sys.executable, "worker.py", "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env=env, check=False)
    refused = f"{path}:2:1: 'metrics' in [worker] must be a string, not an integer"
    assert (done.returncode, done.stderr.strip()) == (2, refused)


def test_the_table_keeps_the_readers_defaults():
    from runtime.catalog import Catalog
    from runtime.queues import DEFAULT_TASK_QUEUE
    from runtime.serve import serve
    from runtime.worker import reading_settings

    defaults = {setting.env: setting.default for setting in SETTINGS}
    catalog = Catalog.from_environment({})
    assert (defaults["COLDSTART_CATALOG"], defaults["COLDSTART_TARGETS"]) == (str(catalog.runbooks_dir),
                                                                                str(catalog.targets_dir))
    assert (defaults["COLDSTART_READINGS_PER_SECOND"], defaults["COLDSTART_READINGS_SHARE"]) == reading_settings({})
    assert defaults["COLDSTART_TASK_QUEUE"] == DEFAULT_TASK_QUEUE
    options = inspect.signature(serve).parameters
    assert (defaults["COLDSTART_METRICS"], defaults["COLDSTART_LOG_LEVEL"]) == (options["metrics"].default.default,
                                                                              options["log_level"].default.default)


def _variables_read() -> dict[str, str]:
    """Every COLDSTART_* (and the TEMPORAL_* coldstart names) in the controller's code, with a file using it."""
    found: dict[str, str] = {}
    files = [REPO / "worker.py", *(path for package in ("runtime", "cli", "activities", "workflows")
                                   for path in sorted((REPO / package).rglob("*.py")))]
    for path in files:
        if path == REPO / "runtime" / "config.py":  # the table itself
            continue
        for name in re.findall(r"\b(COLDSTART_[A-Z0-9_]*[A-Z0-9]|TEMPORAL_[A-Z_]*[A-Z])\b", path.read_text()):
            found.setdefault(name, str(path.relative_to(REPO)))
    return found


def test_every_variable_read_is_a_setting_or_excluded():
    read = _variables_read()
    assert {"COLDSTART_CATALOG", "TEMPORAL_ADDRESS", "COLDSTART_LOG_QUEUE"} <= set(read)  # the scan finds them
    known = {setting.env for setting in SETTINGS} | set(EXCLUDED)
    assert {name: where for name, where in read.items() if name not in known} == {}
    assert set(EXCLUDED) <= set(read) | {CONFIG_ENV}  # an exclusion no code needs any more goes


def test_the_example_file_parses_and_covers_every_setting(tmp_path):
    text = EXAMPLE.read_text()
    assert set(tomllib.loads(text)) == {setting.section for setting in SETTINGS}
    # Uncommented, every line is a valid setting, and a setting with a default shows that default.
    uncommented = tmp_path / "example.toml"
    uncommented.write_text(re.sub(r"^# (\w+ = )", r"\1", text, flags=re.MULTILINE))
    values = load(uncommented, {}).values
    assert {given.setting.name for given in values.values()} == {setting.name for setting in SETTINGS}
    assert {env: given.value for env, given in values.items() if given.setting.default is not None} == {
        setting.env: setting.default for setting in SETTINGS if setting.default is not None}

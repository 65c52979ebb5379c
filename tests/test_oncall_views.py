"""On call at 3 a.m.: every view says what is happening, why, and what to do next (issue 38).

Each test runs the `coldstart` command as the operator does, against the session's dev server and a real worker,
and reads what it printed: a held gate's reason and the next commands (status, the plain follow log, the live view
on a terminal), the Web UI link, Ctrl-C leaving the run going, unknown names answered with a did-you-mean, the run
list, approve's sentence, and one duration format in the plan.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
import uuid
from fcntl import ioctl
from pathlib import Path

import httpx
import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest

from tests import support

REPO = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


@pytest.fixture
async def prom():
    server = await support.ScriptedPrometheus().start()
    yield server
    await server.stop()


def _env(env, task_queue: str, targets: Path, ui_port: int, **extra: str) -> dict[str, str]:
    return {"TEMPORAL_ADDRESS": env.client.service_client.config.target_host, "COLDSTART_TASK_QUEUE": task_queue,
            "COLDSTART_TARGETS": str(targets), "COLDSTART_USER": "alice", "COLDSTART_WEB_UI": f"127.0.0.1:{ui_port}",
            "COLUMNS": "250", **extra}


def cli(env_vars: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **env_vars}, check=False)


async def acli(env_vars: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(cli, env_vars, *args)


def _inventory(targets: Path, name: str, prometheus: str) -> None:
    targets.mkdir(parents=True, exist_ok=True)
    (targets / f"{name}.yaml").write_text(f"name: {name}\ntelemetry: {{prometheus: '{prometheus}'}}\n")


async def _status_json(env_vars: dict[str, str], target: str) -> dict:
    shown = await acli(env_vars, "status", target, "--json")
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


class _Log:
    """A process's output read as it comes (a pipe or a terminal), for waiting on a line."""

    def __init__(self, stream) -> None:
        self.text = ""
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        while True:
            try:
                chunk = os.read(stream, 65536) if isinstance(stream, int) else stream.read1(65536)
            except OSError:  # the terminal's other end closed
                return
            if not chunk:
                return
            self.text += chunk.decode(errors="replace")

    @property
    def plain(self) -> str:
        return ANSI.sub("", self.text)

    async def wait_for(self, *needles: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while not all(needle in self.plain for needle in needles):
            if time.monotonic() > deadline:
                raise AssertionError(f"never printed {needles!r}; printed:\n{self.plain}")
            await asyncio.sleep(0.1)
        return self.plain


def _spawn(env_vars: dict[str, str], *args: str, terminal: bool = False) -> tuple[subprocess.Popen, _Log, _Log | None]:
    """The CLI in the background: its stdout (and stderr) a pipe, or with `terminal`, all three a terminal of
    160 columns (the live view)."""
    environ = {**os.environ, **env_vars}
    if not terminal:
        process = subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=REPO, env=environ,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        return process, _Log(process.stdout), _Log(process.stderr)
    leader, follower = pty.openpty()
    ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    process = subprocess.Popen([sys.executable, "-m", "cli.main", *args], cwd=REPO,
                               env={**environ, "TERM": "xterm-256color"}, stdin=follower, stdout=follower,
                               stderr=follower)
    os.close(follower)
    return process, _Log(leader), None


async def _exit(process: subprocess.Popen, timeout: float = 60.0) -> int:
    return await asyncio.to_thread(process.wait, timeout)


async def test_a_held_gate_says_why_and_what_to_do_next(env, task_queue, tmp_path, prom, ui_port):
    """A gate that cannot read its Prometheus, then one whose value is short: while each reads, status and the
    follow log say how long it has left; once it holds, status, the follow log and the live view say why and
    print the exact retry, skip and abort commands; Ctrl-C leaves the live view and says the run goes on."""
    target = f"held-{uuid.uuid4().hex[:8]}"
    targets = tmp_path / "targets"
    _inventory(targets, target, prom.url)
    prom.script("cache_hit_ratio", 0.62)
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: oncall-held, owner: sre}}
        target: {target}
        approvers: [alice, bob]
        operators: [carol]
        steps:
          - id: ready
            # 20 s: the window in which `coldstart status` (a process of its own) must catch it reading, on a loaded
            # machine too.
            gate: {{name: prometheus-up, endpoint: "http://127.0.0.1:9", query: up, comparator: ">=", threshold: 1,
                    interval: 1s, timeout: 20s}}
            on_failure: hold
          - id: cache
            gate: {{name: cache_hit_ratio, endpoint: "${{{{ target.telemetry.prometheus }}}}", query: cache_hit_ratio,
                    comparator: ">=", threshold: 0.9, interval: 1s, timeout: 3s}}
            on_failure: hold
    """)
    env_vars = _env(env, task_queue, targets, ui_port)
    workflow_id = f"coldstart-{target}"

    async with support.worker(env.client, task_queue):
        # `run --follow` with its output a pipe (a log, CI, `| tee`): the plain lines.
        follower, log, errors = _spawn(env_vars, "run", str(book), "--follow")
        try:
            assert errors is not None
            started = await errors.wait_for(", task queue ")
            found = re.search(rf"started {workflow_id}\n  run ([0-9a-f-]+), task queue ", started)
            assert found, started
            run_id = found.group(1)
            web_ui = f"http://127.0.0.1:{ui_port}/namespaces/default/workflows/{workflow_id}/{run_id}"
            await log.wait_for(f"Web UI: {web_ui}")

            # While the gate reads: its last reading and the time it has left, in status and in the log (the
            # reading within the live view's half-second window after the gate's start went out).
            async def reading():
                shown = await acli(env_vars, "status", target)
                return shown.stdout if "gives up in" in shown.stdout and "prometheus-up=" in shown.stdout else None

            table = await support.wait_for(reading, timeout=30, interval=0.2)
            assert "prometheus-up=none (prometheus at http://127.0.0.1:9 unreachable" in table, table
            assert re.search(r"gives up in \d+(\.\d+)?s", table), table
            await log.wait_for("  ready: prometheus-up=none (prometheus at http://127.0.0.1:9 unreachable", "; gives up in ")

            async def held(step: str):
                return (await _status_json(env_vars, target))["held"] == [step]

            await support.wait_for(lambda: held("ready"), timeout=30, interval=0.3)
            shown = await acli(env_vars, "status", target)
            assert shown.returncode == 0, shown.stderr
            text = shown.stdout
            assert "holds: prometheus-up=none (prometheus at http://127.0.0.1:9 unreachable" in text, text
            assert "ready is held: prometheus-up=none (prometheus at http://127.0.0.1:9 unreachable" in text, text
            assert "  may retry or abort: alice, bob, carol; may skip: alice, bob\n" in text, text
            assert f"  retry: coldstart retry {target} ready\n" in text, text
            assert f"  skip:  coldstart skip {target} ready\n" in text, text
            assert f"  abort: coldstart abort {target} ready\n" in text, text
            assert "waiting: operator" not in text  # the reason, not the bare wait
            assert f"Web UI: {web_ui}" in text
            assert httpx.get(web_ui, timeout=30).status_code == 200  # the dev server's Web UI serves the run's page
            await log.wait_for("ready is held: prometheus-up=none (prometheus at http://127.0.0.1:9 unreachable",
                               f"  retry: coldstart retry {target} ready",
                               f"  skip:  coldstart skip {target} ready",
                               f"  abort: coldstart abort {target} ready")

            # The live view on a terminal, re-attached with `status --follow`: the same reason and commands; Ctrl-C
            # leaves the view, says the run goes on and how to come back.
            live, screen, _ = _spawn(env_vars, "status", target, "--follow", terminal=True)
            try:
                await screen.wait_for(f"Web UI: {web_ui}", "ready is held: prometheus-up=none (prometheus at ",
                                      f"  retry: coldstart retry {target} ready")
                live.send_signal(signal.SIGINT)
                assert await _exit(live) == 130
                told = await screen.wait_for("stopped following")
                assert f"the run goes on. Come back with: coldstart status {target} --follow" in told, told
            finally:
                if live.poll() is None:
                    live.kill()
            assert (await _status_json(env_vars, target))["state"] == "running"

            skipped = await acli(env_vars, "skip", target, "ready", "--as", "bob", "-m", "prometheus is down")
            assert skipped.returncode == 0, skipped.stderr
            assert skipped.stdout.strip() == "skip ready by bob"

            # The next gate reads a value short of its threshold: the reason is the value against it.
            await support.wait_for(lambda: held("cache"), timeout=30, interval=0.3)
            text = (await acli(env_vars, "status", target)).stdout
            assert "cache is held: cache_hit_ratio=0.62 < 0.9" in text, text
            await log.wait_for("cache is held: cache_hit_ratio=0.62 < 0.9",
                               f"  retry: coldstart retry {target} cache")

            aborted = await acli(env_vars, "abort", target, "--as", "carol", "-m", "cache cannot warm tonight")
            assert aborted.returncode == 0, aborted.stderr
            assert aborted.stdout.strip() == "abort requested by carol"
            assert await _exit(follower) == 1  # the run did not succeed
            assert "aborted" in log.plain.splitlines()[-1], log.plain
        finally:
            if follower.poll() is None:
                follower.kill()


async def test_unknown_names_list_and_approve(env, task_queue, tmp_path, ui_port):
    """A mistyped target exits 2 with a did-you-mean and the running targets, whatever the command; the list shows
    whole run names and, once ended, no run state as a step; approve says what it did; the worker (the real one,
    `worker.py`) logs where it connected."""
    target = f"oncall-{uuid.uuid4().hex[:8]}-approvals"
    typo = target.replace("oncall", "onclal")
    targets = tmp_path / "targets"
    support.development_target(targets, target)
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: oncall-approve, owner: sre}}
        target: {target}
        approvers: [alice, bob, carol]
        four_eyes: true
        steps:
          - id: hello
            action: core.note
            with: {{message: "by ${{{{ run.initiator }}}}", journal: "{tmp_path / 'journal.jsonl'}"}}
          - id: go
            approval: {{prompt: "go on?"}}
    """)
    env_vars = _env(env, task_queue, targets, ui_port)
    worker_log = tmp_path / "worker.log"
    with worker_log.open("w") as sink:
        worker = subprocess.Popen([sys.executable, "worker.py", "--allow-development"], cwd=REPO, stdin=subprocess.DEVNULL,
                                  stdout=sink, stderr=subprocess.STDOUT,
                                  env={**os.environ, **env_vars, "COLDSTART_METRICS": ""})
    try:
        async def connected():
            return "worker started" in worker_log.read_text()

        await support.wait_for(connected, timeout=60)
        started = next(json.loads(line) for line in worker_log.read_text().splitlines() if "worker started" in line)
        assert started["temporal"] == env.client.service_client.config.target_host, started
        assert started["namespace"] == "default", started

        # `run` without --follow: the run's Web UI page and how to follow it.
        ran = await acli(env_vars, "run", str(book))
        assert ran.returncode == 0, ran.stderr
        found = re.search(r"\n  run ([0-9a-f-]+), task queue ", ran.stderr)
        assert found, ran.stderr
        run_id = found.group(1)
        assert f"Web UI: http://127.0.0.1:{ui_port}/namespaces/default/workflows/coldstart-{target}/{run_id}" in ran.stderr
        assert f"follow it with: coldstart status {target} --follow" in ran.stderr

        async def awaiting():
            return (await _status_json(env_vars, target))["awaiting_approval"] == ["go"]

        await support.wait_for(awaiting, timeout=60, interval=0.3)
        # Who may approve: alice started the run, and four eyes leaves her out.
        shown = (await acli(env_vars, "status", target)).stdout
        assert "go awaits approval: go on?" in shown, shown
        assert f"  may approve: bob, carol\n  approve with: coldstart approve {target} go\n" in shown, shown

        # `status --follow` (a pipe) says the same, and leaves on Ctrl-C with the way back.
        follower, log, _ = _spawn(env_vars, "status", target, "--follow")
        try:
            await log.wait_for("go awaits approval: go on?", f"  approve with: coldstart approve {target} go",
                               f"Web UI: http://127.0.0.1:{ui_port}/namespaces/default/workflows/coldstart-{target}/")
            follower.send_signal(signal.SIGINT)
            assert await _exit(follower) == 130
        finally:
            if follower.poll() is None:
                follower.kill()

        # A typo, in every command that names a run: exit 2, did you mean, what is running.
        for args in (["status", typo], ["status", typo, "--follow"], ["approve", typo, "go", "--as", "bob"],
                     ["retry", typo, "go", "--as", "bob"], ["skip", typo, "go", "--as", "bob"],
                     ["abort", typo, "--as", "bob"], ["timeline", typo]):
            wrong = await acli(env_vars, *args)
            assert wrong.returncode == 2, (args, wrong.stdout, wrong.stderr)
            assert wrong.stderr.startswith(f"error: no run for target '{typo}'; did you mean '{target}'?"), \
                (args, wrong.stderr)
            assert "running: " in wrong.stderr and target in wrong.stderr.splitlines()[1], wrong.stderr
            assert "see `coldstart list`" in wrong.stderr, wrong.stderr
            assert "Traceback" not in wrong.stderr

        # The list at 80 columns: the run's name whole, on one line.
        # (--target: the other tests' runs on this shared server would share the table's 80 columns.)
        listed = await acli({**env_vars, "COLUMNS": "80"}, "list", "--target", target)
        assert listed.returncode == 0, listed.stderr
        row = next((line for line in listed.stdout.splitlines() if f"coldstart-{target}" in line), None)
        assert row is not None, listed.stdout
        assert row.split()[0] == f"coldstart-{target}" and row.split()[-3] == "go", listed.stdout

        # The approve command as status printed it, pasted by bob: it acts as whoever runs it.
        command = re.search(r"approve with: (coldstart approve \S+ go)\n", shown)
        assert command, shown
        approved = await acli({**env_vars, "COLDSTART_USER": "bob"}, *command.group(1).split()[1:])
        assert approved.returncode == 0, approved.stderr
        assert approved.stdout.strip() == "approved go by bob"
        assert not approved.stdout.lstrip().startswith("{")
        await env.client.get_workflow_handle(f"coldstart-{target}").result()

        done = await acli({**env_vars, "COLUMNS": "80"}, "list", "--all", "--target", target)
        row = next(line for line in done.stdout.splitlines() if f"coldstart-{target}" in line)
        cells = row.split()
        # The run's own outcome as its status, and no step (the state is no step): workflow, status, runbook (folded
        # at 80 columns), started (day, time).
        assert cells[:2] == [f"coldstart-{target}", "succeeded"] and len(cells) == 5, done.stdout
        assert row.count("succeeded") == 1, done.stdout
        # The timeline says its durations the same way: `after 12.3s`, `(0.05s)`.
        told = (await acli(env_vars, "timeline", target)).stdout
        assert re.search(r"^- outcome: \*\*succeeded\*\* after \d+(\.\d)?s$", told, re.MULTILINE), told
        assert re.search(r"\| hello \| action completed \|.* \(\d+(\.\d+)?s\) \|$", told, re.MULTILINE), told
        # Approving again: the run has ended, which its own refusal says (exit 1, not 2 for an unknown name, nor 0).
        again = await acli(env_vars, "approve", target, "go", "--as", "carol")
        assert (again.returncode, again.stderr.strip()) == (1, "error: approve: workflow execution already completed"), (
            again.returncode, again.stdout, again.stderr)
    finally:
        worker.send_signal(signal.SIGTERM)
        await _exit(worker)


async def test_a_refused_run_says_why_and_what_to_do_where_it_is_followed(env, task_queue, tmp_path, ui_port):
    """A runbook the controller's catalog does not hold, on a target that is no development target: `run --follow`
    ends saying the refusal and its remedy (the catalog's directory), not only `failed`; once the file is in the
    catalog the same command runs it, with no worker restart."""
    from runtime.catalog import Catalog

    target = f"refused-{uuid.uuid4().hex[:8]}"
    targets, catalog = tmp_path / "targets", tmp_path / "catalog"
    catalog.mkdir()
    _inventory(targets, target, "http://127.0.0.1:9")
    book = support.write_runbook(tmp_path, f"metadata: {{name: mine}}\ntarget: {target}\nsteps: [{{id: a, wait: 0.1s}}]\n")
    env_vars = _env(env, task_queue, targets, ui_port, COLDSTART_CATALOG=str(catalog))
    planned = await acli(env_vars, "plan", str(book))
    assert planned.returncode == 0 and planned.stderr.startswith(
        f"warning: runbook 'mine' ({book}) is not in the catalog at {catalog} ($COLDSTART_CATALOG) with this text; "
        f"target '{target}' is no development target: the controller refuses the run."), planned.stderr
    async with support.worker(env.client, task_queue, catalog=Catalog(catalog, targets)):
        refused = await acli(env_vars, "run", str(book), "--follow")
        assert refused.returncode == 1, refused.stderr
        why = next((line for line in refused.stdout.splitlines() if line.startswith("failed: ")), refused.stdout)
        assert "runbook 'mine'" in why and "is not in the controller's catalog" in why, refused.stdout
        assert f"to run it, put the file in {catalog} ($COLDSTART_CATALOG, [catalog] runbooks)" in why, why
        (catalog / book.name).write_text(book.read_text())
        assert (await acli(env_vars, "plan", str(book))).stderr == ""
        ran = await acli(env_vars, "run", str(book), "--follow")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert not [line for line in ran.stdout.splitlines() if line.startswith("failed")], ran.stdout


async def test_an_empty_list_points_at_all_and_an_unknown_inventory_at_coldstart_targets(env, tmp_path, ui_port):
    """In a namespace with no run, `list` says so and hints at --all, and `status` says nothing runs; a missing
    inventory names $COLDSTART_TARGETS."""
    namespace = f"oncall-empty-{uuid.uuid4().hex[:8]}"
    await env.client.workflow_service.register_namespace(RegisterNamespaceRequest(
        namespace=namespace, workflow_execution_retention_period=Duration(seconds=86400)))
    env_vars = _env(env, "unused", tmp_path / "targets", ui_port, TEMPORAL_NAMESPACE=namespace)

    async def listed():
        result = await acli(env_vars, "list")
        return result if result.returncode == 0 else None  # the new namespace reaches the frontend's cache first

    result = await support.wait_for(listed, timeout=60, interval=0.5)
    assert result.stdout.strip() == "no run is running (`coldstart list --all` shows the finished ones too)"
    wrong = await acli(env_vars, "status", "local")
    assert wrong.returncode == 2 and wrong.stderr.splitlines() == [
        "error: no run for target 'local'", "no run is running", "see `coldstart list` (--all: the finished runs too)"]

    book = support.write_runbook(tmp_path, "metadata: {name: nowhere}\ntarget: local2\nsteps: [{id: a, wait: 1s}]\n")
    missing = await acli(env_vars, "plan", str(book))
    assert missing.returncode == 2
    assert (f"no inventory for target 'local2' (looked for {tmp_path / 'targets' / 'local2.yaml'}; $COLDSTART_TARGETS "
            f"names the inventories' directory, now '{tmp_path / 'targets'}')") in missing.stderr, missing.stderr


def test_plan_says_durations_as_a_runbook_does_and_resolves_the_run(tmp_path):
    """`plan`: durations as the runbook writes them (2s, 90s, 1h30m), and ${{ run.initiator }} / ${{ run.target }}
    as the run will have them; references only the run knows stay as written."""
    targets = tmp_path / "targets"
    _inventory(targets, "oncall-plan", "http://127.0.0.1:9")
    book = support.write_runbook(tmp_path, """
        metadata: {name: oncall-plan}
        target: oncall-plan
        approvers: [alice]
        params:
          settle: {type: duration, default: 2s}
          long: {type: duration, default: 1h30m}
        steps:
          - id: hello
            action: core.note
            with: {message: "started by ${{ run.initiator }} on ${{ run.target }} as ${{ run.id }}"}
          - id: settle
            wait: ${{ params.settle }}
          - id: soak
            wait: 1h30m
          - id: ready
            gate: {name: up, endpoint: "${{ target.telemetry.prometheus }}", query: up, comparator: ">=", threshold: 1,
                   interval: 1s, timeout: 90s, consecutive: 2, bake: 2m30s}
    """)
    shown = cli({"COLDSTART_TARGETS": str(targets), "COLDSTART_USER": "alice", "COLUMNS": "200"}, "plan", str(book))
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "params: settle=2s, long=1h30m" in text, text
    assert "wait 2s" in text and "wait 1h30m" in text, text
    assert "(2x over 2m30s, every 1s, timeout 90s)" in text, text
    assert "started by alice on oncall-plan as ${{ run.id }}" in text, text
    assert not re.search(r"\d:\d\d:\d\d", text), text  # no timedelta's 1:30:00 anywhere
    assert "settle=2.0" not in text

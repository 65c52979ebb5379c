"""The `coldstart` command: validate, plan, run and steer runbooks.

Exit codes: 0 success; 1 the run or operation failed; 2 invalid input (runbook, parameters,
arguments; nothing was started); 3 the target is busy with another run; 4 Temporal unreachable;
5 the run refused the request (an Update validator said no).
"""

from __future__ import annotations

import getpass
import json
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from typer.core import TyperGroup

from activities.errors import ColdstartError, InvalidInput, LocatedErrors
from cli.config_cmd import CONFIG_OPTION, apply_config, show_config

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = ["app", "main"]

EXIT_FAILED, EXIT_INVALID, EXIT_BUSY, EXIT_UNREACHABLE, EXIT_REFUSED = 1, 2, 3, 4, 5
T = TypeVar("T")

class _Commands(TyperGroup):
    """The root command group: a runbook, inventory or triggers file refused anywhere below prints every
    problem, each `file:line:col: message`, and exits 2 (the one handler of LocatedErrors)."""

    # typer hands its own Context (a subclass); the base names the click Context typer vendors.
    def invoke(self, ctx: typer.Context) -> Any:  # pyright: ignore[reportIncompatibleMethodOverride]
        try:
            return super().invoke(ctx)
        except LocatedErrors as exc:
            for line in exc.errors:
                err.print(line, markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_INVALID) from None


app = typer.Typer(
    cls=_Commands,
    help="Declarative runbook automation and staged recovery on Temporal.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
out = Console(emoji=False)
err = Console(stderr=True, emoji=False)


def version() -> str:
    """The installed distribution's version; a source tree's pyproject.toml when coldstart is not installed."""
    from runtime.version import controller_version

    return controller_version()


def _print_version(asked: bool) -> None:
    if asked:
        sys.stdout.write(f"coldstart {version()}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    ctx: typer.Context,
    show_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                      help="print the version and exit"),
    config: Path | None = CONFIG_OPTION,
) -> None:
    apply_config(ctx, config)


app.command("config", help="Every setting's value and where it comes from: environment, file or default.")(show_config)


class CliError(ColdstartError):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def _fail(message: str, code: int) -> NoReturn:
    raise CliError(message, code)


def _targets_dir() -> Path:
    return Path(os.environ.get("COLDSTART_TARGETS", "targets"))


def _whoami() -> str:
    return os.environ.get("COLDSTART_USER") or getpass.getuser()


def _params(pairs: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            _fail(f"--param {pair!r}: use NAME=VALUE", EXIT_INVALID)
        name, raw = pair.split("=", 1)
        try:
            values[name] = json.loads(raw)
        except ValueError:
            values[name] = raw
    return values


def _inventory(target: str | None) -> dict[str, Any] | None:
    from workflows.loader import load_inventory

    if not target:
        return None
    try:
        return load_inventory(target, _targets_dir()).as_target()
    except LocatedErrors:
        raise  # every line printed by _run
    except (OSError, ValueError) as exc:
        _fail(str(exc).splitlines()[0], EXIT_INVALID)
    return None



def _await(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; asyncio is imported here, so commands that await nothing start without it."""
    import asyncio

    return asyncio.run(coro)


def _plan(file: Path, params: list[str], target: str | None, *, drill: bool = False, placeholders: bool = False):
    from activities.catalog import load_contracts
    from workflows.loader import plan_run

    inventory = _inventory(target)
    notes: list[str] = []
    planned = plan_run(
        file,
        registry=load_contracts(),
        params=_params(params),
        inventory=inventory,
        targets_dir=_targets_dir(),
        initiator=_whoami(),
        drill=drill,
        placeholders=placeholders,
        notes=notes,
    )
    for line in notes:
        if line not in _NOTED:  # a fleet plans one run per target: say it once
            _NOTED.add(line)
            err.print(line, markup=False, highlight=False, soft_wrap=True)
    return planned


_NOTED: set[str] = set()


async def _client() -> Client:
    from runtime.connection import connect

    try:
        return await connect()
    except Exception as exc:  # noqa: BLE001 - any connection problem is the same answer for the operator
        address = os.environ.get("TEMPORAL_ADDRESS", "localhost:7233")
        _fail(f"cannot reach Temporal at {address}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__} "
              f"(start one with `coldstart server` or set TEMPORAL_ADDRESS)", EXIT_UNREACHABLE)


def _workflow_id(run: str) -> str:
    from runtime.runs import workflow_id_for

    return run if run.startswith("coldstart-") else workflow_id_for(run)


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


_IDENTITY_PANEL = "Verified identity (Vault OIDC)"
_OPT_IDENTITY_TOKEN = typer.Option(
    None, "--identity-token", metavar="FILE", rich_help_panel=_IDENTITY_PANEL,
    help="a file holding a Vault OIDC identity token that proves who you are ('-': read it from stdin); never the "
         "token itself, which the process list and shell history would keep")
_OPT_VAULT_LOGIN = typer.Option(
    False, "--vault-login", rich_help_panel=_IDENTITY_PANEL,
    help="fetch the identity token from Vault with your own login (userpass: --vault-user, password from "
         "$VAULT_PASSWORD or asked; --vault-auth token: $VAULT_TOKEN or ~/.vault-token)")
_OPT_VAULT_ADDR = typer.Option(None, "--vault-addr", envvar="VAULT_ADDR", show_envvar=True,
                               rich_help_panel=_IDENTITY_PANEL,
                               help="your Vault, the one --vault-login logs in to (a run whose tokens come from "
                                    "another Vault is refused)")
_OPT_IDENTITY_ROLE = typer.Option("coldstart-approver", "--identity-role", rich_help_panel=_IDENTITY_PANEL,
                                  help="the Vault OIDC role to fetch the token from (with --vault-login)")
_OPT_VAULT_USER = typer.Option(None, "--vault-user", rich_help_panel=_IDENTITY_PANEL,
                               help="your Vault userpass name (default: the --as name)")
_OPT_VAULT_AUTH = typer.Option("userpass", "--vault-auth", metavar="userpass|token", rich_help_panel=_IDENTITY_PANEL,
                               help="how --vault-login logs in: a userpass login, or your existing Vault token")
_MAX_STDIN_TOKEN = 64 * 1024


@app.command()
def validate(
    files: list[Path] = typer.Argument(..., help="runbook files"),
    target: str | None = typer.Option(None, help="also resolve target references against targets/NAME.yaml"),
    json_output: bool = typer.Option(False, "--json", help="machine-readable result"),
) -> None:
    """Check runbooks; every problem is reported as file:line:col: message (exit 2 if any)."""
    from activities.catalog import load_contracts
    from workflows.loader import RunbookInvalid, plan_run

    registry = load_contracts()
    results = []
    inventory = _inventory(target)
    for file in files:
        notes: list[str] = []
        try:
            plan_run(file, registry=registry, inventory=inventory, placeholders=True, notes=notes)
            results.append({"file": str(file), "ok": True, "errors": [], "notes": notes})
        except RunbookInvalid as exc:
            results.append({"file": str(file), "ok": False, "errors": exc.errors, "notes": []})
    if json_output:
        _print_json(results)
    else:
        for result in results:
            if result["ok"]:
                out.print(f"{result['file']}: ok", highlight=False)
            for line in result["errors"] + result["notes"]:
                err.print(line, markup=False, highlight=False, soft_wrap=True)
    if not all(r["ok"] for r in results):
        raise typer.Exit(EXIT_INVALID)


@app.command()
def plan(
    file: Path,
    param: list[str] = typer.Option([], "--param", "-p", help="NAME=VALUE (JSON values accepted)"),
    target: str | None = typer.Option(None, help="inventory name (default: the runbook's target)"),
    json_output: bool = typer.Option(False, "--json"),
) -> None:
    """A dry run: the resolved steps, waits, gates and approvals; nothing is executed."""
    run = _plan(file, param, target)
    if json_output:
        _print_json(run.model_dump(mode="json", by_alias=True))
    else:
        from cli import render

        render.plan(out, run)
        if (warning := _catalog_warning(file, run.runbook.metadata.name, run.target_name,
                                        bool(run.target.get("development")))) is not None:
            err.print(f"warning: {warning}", style="yellow", highlight=False, markup=False, soft_wrap=True)


def _catalog_warning(file: Path, name: str, target: str, development: bool) -> str | None:
    """Whether the controller would refuse this file, read from the catalog directory this shell names (a worker
    reads its own, usually the same): a runbook runs when its exact text is catalogued, or on a development
    target of a worker started with --allow-development."""
    from workflows.loader import runbook_digest
    from workflows.yaml_safety import read_text

    directory = Path(os.environ.get("COLDSTART_CATALOG", "runbooks"))
    digest = runbook_digest(read_text(file))
    texts = {}
    for path in sorted(directory.glob("*.yaml")) if directory.is_dir() else []:
        try:
            texts[runbook_digest(read_text(path))] = path
        except (OSError, ValueError):
            continue
    if digest in texts:
        return None
    unless = (f"target {target!r} is a development target: it runs only on a worker started with --allow-development"
              if development else f"target {target!r} is no development target: the controller refuses the run")
    return (f"runbook {name!r} ({file}) is not in the catalog at {directory} ($COLDSTART_CATALOG) with this text; "
            f"{unless}. Put the file there to run it (read at the next run, no worker restart)")


@app.command()
def run(
    file: Path,
    param: list[str] = typer.Option([], "--param", "-p", help="NAME=VALUE (JSON values accepted)"),
    target: str | None = typer.Option(None, help="inventory name (default: the runbook's target)"),
    follow: bool = typer.Option(False, "--follow", "-f", help="show live progress until the run ends"),
    drill: bool = typer.Option(False, help="mark the run as a drill (refused on a target not marked drill: true)"),
    json_output: bool = typer.Option(False, "--json"),
    targets: str | None = typer.Option(None, "--targets", help="a fleet run: one run per target (a,b,c), in waves"),
    waves: str | None = typer.Option(None, "--waves", help="with --targets: sizes of the first waves in target "
                                                             "order (1,2: a canary, then two); the rest is one last wave"),
    max_parallel: int = typer.Option(0, "--max-parallel", min=0, help="with --targets: runs at once per wave (0: all)"),
    continue_on_failure: bool = typer.Option(False, "--continue-on-failure",
                                             help="with --targets: later waves start even after a failed run"),
    fleet_name: str | None = typer.Option(None, "--fleet-name", help="with --targets: the fleet's name "
                                                                         "(default: the runbook's)"),
    identity_token: str | None = _OPT_IDENTITY_TOKEN,
    vault_login: bool = _OPT_VAULT_LOGIN,
    vault_addr: str | None = _OPT_VAULT_ADDR,
    vault_user: str | None = _OPT_VAULT_USER,
    vault_auth: str = _OPT_VAULT_AUTH,
) -> None:
    """Start a run of a runbook on its target (one run per target at a time), or on many targets in waves."""
    from runtime.connection import task_queue
    from runtime.runs import TargetBusy, start_run

    if targets is not None:
        raise typer.Exit(_run_fleet(file, param, targets, waves, max_parallel, continue_on_failure, fleet_name,
                                    drill, json_output))
    if waves is not None or max_parallel or continue_on_failure or fleet_name:
        _fail("--waves, --max-parallel, --continue-on-failure and --fleet-name go with --targets", EXIT_INVALID)
    plan_input = _plan(file, param, target, drill=drill)
    if drill and not plan_input.target.get("drill"):
        _fail(f"target {plan_input.target_name} is not marked as a drill target (drill: true); refusing a drill", EXIT_INVALID)

    from cli.identity import start_source
    from runtime.runs import workflow_id_for

    source = start_source(plan_input, workflow_id_for(plan_input.target_name)) if vault_login else None
    if vault_login and source is None:
        _fail(f"--vault-login: runbook {plan_input.runbook.metadata.name} on target {plan_input.target_name} verifies "
              "no starter (no identity provider)", EXIT_INVALID)
    token = _identity_token(identity_token, vault_login, vault_addr, "", vault_user, vault_auth, _whoami(), source)

    async def go() -> int:
        from runtime.connection import web_ui_url

        client = await _client()
        try:
            handle = await start_run(client, plan_input, task_queue(), identity_token=token)
        except TargetBusy as exc:
            _fail(str(exc), EXIT_BUSY)
        web_ui = web_ui_url(client, handle.id, handle.result_run_id)
        if json_output and not follow:
            _print_json({"workflow_id": handle.id, "run_id": handle.result_run_id, "web_ui": web_ui})
            return 0
        err.print(f"started {handle.id}\n  run {handle.result_run_id}, task queue {task_queue()}", highlight=False)
        if follow:
            return await _follow(client, handle.id, web_ui, _ref_of(plan_input.target_name, handle.id))
        err.print(f"Web UI: {web_ui}", highlight=False, soft_wrap=True)
        err.print(f"follow it with: coldstart status {_ref_of(plan_input.target_name, handle.id)} --follow",
                  highlight=False)
        return 0

    raise typer.Exit(_following(go))


def _ref_of(target: str, workflow_id: str) -> str:
    """How commands name a run: its target, or its workflow id when it is not the target's."""
    from runtime.runs import workflow_id_for

    return target if workflow_id == workflow_id_for(target) else workflow_id


async def _follow(client: Any, workflow_id: str, web_ui: str, ref: str) -> int:
    """The live view until the run ends; Ctrl-C leaves the view, never the run (_following says so)."""
    from cli import render

    _FOLLOWED[:] = [ref]
    return await render.follow(client, workflow_id, out, web_ui=web_ui)


_FOLLOWED: list[str] = []  # the run a view follows, to say how to come back to it after Ctrl-C


def _following(go: Any) -> int:
    """Run `go` (a command that may follow a run); Ctrl-C while following says the run goes on, and how to
    come back to it, and exits 130."""
    try:
        return _await(go())
    except KeyboardInterrupt:
        if not _FOLLOWED:
            raise
        err.print(f"stopped following; the run goes on. Come back with: coldstart status {_FOLLOWED[0]} --follow",
                  highlight=False, soft_wrap=True)
        return 130


def _run_fleet(file: Path, param: list[str], targets: str, waves: str | None, max_parallel: int,
               continue_on_failure: bool, name: str | None, drill: bool, json_output: bool) -> int:
    """Plan every target's run (nothing starts if one is invalid), then start the fleet workflow."""
    from cli.fleet import FleetInvalid, plan_fleet, start_fleet
    from runtime.connection import task_queue
    from runtime.runs import TargetBusy

    names = [t.strip() for t in targets.split(",") if t.strip()]
    if not names:
        _fail("--targets names no target", EXIT_INVALID)
    try:
        sizes = [int(w) for w in waves.split(",")] if waves else None
    except ValueError:
        _fail(f"--waves {waves!r}: comma-separated wave sizes, e.g. 1,2", EXIT_INVALID)

    def plan_one(target: str):
        planned = _plan(file, param, target, drill=drill)
        if drill and not planned.target.get("drill"):
            _fail(f"target {target} is not marked as a drill target (drill: true); refusing a drill", EXIT_INVALID)
        return planned

    try:
        fleet = plan_fleet(plan_one, names, sizes, name=name, initiator=_whoami(), max_parallel=max_parallel,
                           on_failure="continue" if continue_on_failure else "stop")
    except FleetInvalid as exc:
        _fail(str(exc), EXIT_INVALID)

    async def go() -> int:
        client = await _client()
        try:
            handle = await start_fleet(client, fleet, task_queue())
        except TargetBusy as exc:
            _fail(str(exc), EXIT_BUSY)
        from runtime.connection import web_ui_url

        web_ui = web_ui_url(client, handle.id, handle.result_run_id)
        if json_output:
            _print_json({"workflow_id": handle.id, "run_id": handle.result_run_id, "web_ui": web_ui,
                         "members": [{"target": m.target, "wave": m.wave} for m in fleet.members]})
        else:
            err.print(f"started fleet {handle.id} (run {handle.result_run_id}): {fleet.runbook} on "
                      f"{len(fleet.members)} targets in {len({m.wave for m in fleet.members})} waves", highlight=False)
            err.print(f"Web UI: {web_ui}", highlight=False, soft_wrap=True)
        return 0

    return _await(go())


async def _describe(client: Any, run_ref: str) -> Any:
    """The run's description; exit 2 naming the runs there are when `run_ref` names none."""
    from temporalio.service import RPCError

    workflow_id = _workflow_id(run_ref)
    try:
        return await client.get_workflow_handle(workflow_id).describe()
    except RPCError as exc:
        await _no_such_run(client, run_ref, exc)
        _fail(f"{workflow_id}: {exc.message}", EXIT_FAILED)


async def _no_such_run(client: Any, run_ref: str, exc: BaseException) -> None:
    """Exit 2 when `exc` says `run_ref` names no run (and a describe agrees: an Update on a run that has ended
    is refused as not found too, and its own message says so better), with a did-you-mean among the runs there
    are and the running ones; return otherwise."""
    from temporalio.service import RPCError, RPCStatusCode

    if not isinstance(exc, RPCError) or exc.status != RPCStatusCode.NOT_FOUND:
        return
    try:
        await client.get_workflow_handle(_workflow_id(run_ref)).describe()
        return
    except RPCError as again:
        if again.status != RPCStatusCode.NOT_FOUND:
            return
    _fail(await _unknown_run(client, run_ref), EXIT_INVALID)


async def _unknown_run(client: Any, run_ref: str) -> str:
    """`no run for target 'lcoal'; did you mean 'local'?`, the running targets, and where to look."""
    import difflib

    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    from workflows import search

    by_id = run_ref.startswith("coldstart-")
    names: list[str] = []  # how recent runs are named (their targets, or their workflow ids), newest first
    running: list[str] = []
    try:
        async for execution in client.list_workflows(
                "WorkflowType = 'RunbookWorkflow' OR WorkflowType = 'FleetWorkflow'", limit=200):
            target = execution.typed_search_attributes.get(search.TARGET)
            ref = _ref_of(target, execution.id) if target else execution.id
            if (name := execution.id if by_id else ref) not in names:
                names.append(name)
            if execution.status == WorkflowExecutionStatus.RUNNING and ref not in running:
                running.append(ref)
    except RPCError:
        pass  # the answer stays: no such run, without the suggestions
    what = f"no run with workflow id {run_ref!r}" if by_id else f"no run for target {run_ref!r}"
    close = difflib.get_close_matches(run_ref, names, n=3, cutoff=0.6)
    lines = [what + (f"; did you mean {' or '.join(repr(name) for name in close)}?" if close else "")]
    shown = ", ".join(running[:10]) + (f" and {len(running) - 10} more" if len(running) > 10 else "")
    lines.append(f"running: {shown}" if running else "no run is running")
    lines.append("see `coldstart list` (--all: the finished runs too)")
    return "\n".join(lines)


async def _fleet_status(client: Any, run_ref: str, description: Any = None) -> Any:
    """The fleet's status if `run_ref` names a fleet run, else None; exit 2 if it names no run."""
    from workflows.contract import FleetStatus

    description = description or await _describe(client, run_ref)
    if description.workflow_type != "FleetWorkflow":
        return None
    return await client.get_workflow_handle(description.id).query("status", result_type=FleetStatus)


@app.command()
def status(
    run_ref: str = typer.Argument(..., metavar="TARGET|WORKFLOW_ID"),
    json_output: bool = typer.Option(False, "--json"),
    follow: bool = typer.Option(False, "--follow", "-f", help="follow the run live until it ends (Ctrl-C leaves "
                                                             "the view, never the run)"),
) -> None:
    """Where a run is: current step, each step's outcome and its gate readings, what it waits on and the commands
    that answer it, its Web UI page (--json: with outputs; --follow: live, as `run --follow`)."""
    from cli import render
    from runtime.connection import web_ui_url

    if follow and json_output:
        _fail("--follow or --json: give one of them", EXIT_INVALID)

    async def go() -> int:
        client = await _client()
        description = await _describe(client, run_ref)
        fleet = await _fleet_status(client, run_ref, description)
        if fleet is not None:
            from cli.fleet import member_runs, render_status

            if follow:
                _fail(f"{description.id} is a fleet: follow its runs one by one (coldstart status TARGET --follow)",
                      EXIT_INVALID)
            runs = await member_runs(client, fleet, outputs=json_output)
            if json_output:
                _print_json({**fleet.model_dump(mode="json"),
                             "runs": {t: r.model_dump(mode="json") for t, r in runs.items()}})
            else:
                render_status(out, fleet, runs)
                out.print(f"Web UI: {web_ui_url(client, description.id, description.run_id)}", highlight=False,
                          markup=False, soft_wrap=True)
            return 0
        web_ui = web_ui_url(client, description.id, description.run_id)
        if follow:
            return await _follow(client, description.id, web_ui, run_ref)
        current = await _run_status(client, description.id, outputs=json_output)
        if json_output:
            _print_json(current.model_dump(mode="json"))
        else:
            render.status(out, current, web_ui=web_ui)
        return 0

    raise typer.Exit(_following(go))


async def _run_status(client, workflow_id: str, *, outputs: bool):
    """The run's status: with `outputs`, all of it (a running run's status Query, which the worker answers;
    a closed run's close event); else the status it keeps in its memo, from the server (cli/polling)."""
    from temporalio.service import RPCError

    from runtime.polling import read_full_status, read_kept_status

    handle = client.get_workflow_handle(workflow_id)
    try:
        return await (read_full_status(handle) if outputs else read_kept_status(handle))
    except RPCError as exc:
        _fail(f"{workflow_id}: {exc.message}", EXIT_FAILED)


@app.command("list")
def list_runs(
    all_runs: bool = typer.Option(False, "--all", help="include finished runs"),
    limit: int = typer.Option(20),
    target: str | None = typer.Option(None, "--target", help="only the runs on this target"),
    runbook: str | None = typer.Option(None, "--runbook", help="only the runs of this runbook (its metadata name)"),
    json_output: bool = typer.Option(False, "--json"),
) -> None:
    """Runs, newest first, with their runbook, target, current step and whether they await approval."""
    from cli import render
    from workflows import search

    async def go() -> None:
        client = await _client()
        query = "WorkflowType = 'RunbookWorkflow'" + ("" if all_runs else " AND ExecutionStatus = 'Running'")
        for key, value in ((search.TARGET, target), (search.RUNBOOK, runbook)):
            if value is not None:
                query += f" AND {key.name} = {json.dumps(value)}"  # a JSON string is a quoted visibility literal
        rows = []
        async for execution in client.list_workflows(query, limit=limit):
            attrs = execution.typed_search_attributes
            rows.append(
                {
                    "workflow_id": execution.id,
                    "run_id": execution.run_id,
                    "status": execution.status.name.lower() if execution.status else "?",
                    "runbook": attrs.get(search.RUNBOOK),
                    "target": attrs.get(search.TARGET),
                    "step": attrs.get(search.CURRENT_STEP),
                    "awaiting_approval": attrs.get(search.AWAITING_APPROVAL),
                    "drill": attrs.get(search.DRILL),
                    "started": execution.start_time,
                }
            )
        if json_output:
            _print_json(rows)
        else:
            render.runs(out, rows, all_runs=all_runs)

    _await(go())


def _update(run_ref: str, name: str, body: Any) -> Any:
    """Send Update `name` to the run; what it answered (a sentence, or approve's record)."""
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.service import RPCError

    async def go() -> Any:
        client = await _client()
        handle = client.get_workflow_handle(_workflow_id(run_ref))
        try:
            return await handle.execute_update(name, body)
        except WorkflowUpdateFailedError as exc:
            reason = str(getattr(exc.cause, "message", exc.cause))
            _fail(f"{name} refused: {reason}{_who_hint(reason)}", EXIT_REFUSED)
        except RPCError as exc:
            await _no_such_run(client, run_ref, exc)
            _fail(f"{name}: {exc.message}", EXIT_FAILED)

    return _await(go())


def _who_hint(reason: str) -> str:
    """A refusal of who decides names how a decision is sent under another name: the name came from somewhere."""
    if " may not " not in reason:
        return ""
    return " (the name is --as NAME, else $COLDSTART_USER, else your login: decide as one of those named)"


def _say(result: Any, json_output: bool = False) -> None:
    """An Update's answer: a sentence (`retry held by carol`, `approved go by bob: looks right`), or --json's raw."""
    if result is None:
        return
    if json_output:
        _print_json(result)
    elif isinstance(result, dict) and {"step", "approver"} <= result.keys():
        verified = f" (verified {result['subject']})" if result.get("subject") else ""
        comment = f": {result['comment']}" if result.get("comment") else ""
        out.print(f"approved {result['step']} by {result['approver']}{verified}{comment}", highlight=False,
                  markup=False, soft_wrap=True)
    else:
        out.print(result if isinstance(result, str) else json.dumps(result, default=str), highlight=False,
                  markup=False, soft_wrap=True)




def _identity_token(token: str | None, vault_login: bool, vault_addr: str | None, role: str,
                    vault_user: str | None, vault_auth: str, who: str, source: Any = None) -> str | None:
    """The identity token for a request: given, read from stdin ('-'), or fetched with the operator's Vault login
    (from the run's OIDC provider, bound to the decision, when `source` (a cli.identity.DecisionSource) is given)."""
    if token is not None and vault_login:
        _fail("--identity-token and --vault-login: give one of them", EXIT_INVALID)
    if token == "-":
        token = given = sys.stdin.read(_MAX_STDIN_TOKEN + 1)
        if len(given) > _MAX_STDIN_TOKEN:
            _fail(f"--identity-token -: more than {_MAX_STDIN_TOKEN} bytes on stdin, that is not a token",
                  EXIT_INVALID)
    elif token is not None:
        token = _token_file(token)
    if token is not None:
        token = token.strip()
        if not token:
            _fail("--identity-token: the token is empty", EXIT_INVALID)
        return token
    if not vault_login:
        return None
    if vault_auth not in ("userpass", "token"):
        _fail(f"--vault-auth {vault_auth!r}: use userpass or token", EXIT_INVALID)
    from cli.identity import IdentityTokenError, fetch_decision_token, fetch_identity_token, own_vault

    if source is not None:
        # The login goes to the operator's own Vault, and only when it is the run's: the run says where its tokens
        # verify, never where a password or token is sent.
        try:
            vault_addr = own_vault(vault_addr, source.vault)
        except IdentityTokenError as exc:
            _fail(f"--vault-login: {exc}", EXIT_INVALID)
    if not vault_addr:
        _fail("--vault-login: set VAULT_ADDR or pass --vault-addr", EXIT_INVALID)

    def fetch(**login: Any) -> str:
        if source is None:
            return fetch_identity_token(vault_addr, role, **login)
        return fetch_decision_token(vault_addr, source.provider, source.audience, source.nonce,
                                    ca_cert=source.ca_cert, **login)

    try:
        if vault_auth == "token":
            return fetch()
        user = vault_user or who
        password = os.environ.get("VAULT_PASSWORD") or getpass.getpass(f"Vault password for {user}: ",
                                                                       stream=sys.stderr)
        return fetch(username=user, password=password)
    except IdentityTokenError as exc:
        _fail(f"identity token: {exc}", EXIT_FAILED)
    return None  # unreachable: _fail raises


def _check_login(vault_auth: str) -> None:
    if vault_auth not in ("userpass", "token"):
        _fail(f"--vault-auth {vault_auth!r}: use userpass or token", EXIT_INVALID)


def _decision(run_ref: str, verb: str, step: str | None, vault_login: bool,
              vault_auth: str = "userpass") -> tuple[Any, str | None]:
    """(where the token for `verb` on `step` comes from, the step) for the run; (None, step) without --vault-login."""
    if not vault_login:
        return None, step
    _check_login(vault_auth)
    from temporalio.service import RPCError

    from cli.identity import decision_source

    async def go() -> tuple[Any, str | None]:
        client = await _client()
        try:
            return await decision_source(client.get_workflow_handle(_workflow_id(run_ref)), verb, step)
        except RPCError as exc:
            await _no_such_run(client, run_ref, exc)
            _fail(f"{verb}: {exc.message}", EXIT_FAILED)
        return None, step  # unreachable: _fail raises

    return _await(go())


def _token_file(name: str) -> str:
    """The token in file `name`; a value that is no file is refused (a token typed on the command line leaks)."""
    path = Path(name)
    try:
        is_file = path.is_file()
    except OSError:  # a name too long to be a path: a token pasted in, most likely
        is_file = False
    if not is_file:
        _fail("--identity-token: give a file holding the token, or '-' to read it from stdin (a token on the "
              "command line is seen in the process list and kept in shell history)", EXIT_INVALID)
    try:
        with path.open() as fh:
            text = fh.read(_MAX_STDIN_TOKEN + 1)
    except OSError as exc:
        _fail(f"--identity-token {name}: cannot read: {exc.strerror or exc}", EXIT_INVALID)
    if len(text) > _MAX_STDIN_TOKEN:
        _fail(f"--identity-token {name}: more than {_MAX_STDIN_TOKEN} bytes, that is not a token", EXIT_INVALID)
    return text


def _request(model: Any, **fields: Any) -> Any:
    """The request as the workflow's validators will read it, or exit 2 with their one-line reason."""
    from workflows.contract import RequestError, parse_request

    try:
        return parse_request(model, fields)
    except RequestError as exc:
        _fail(str(exc), EXIT_INVALID)


@app.command()
def approve(
    run_ref: str = typer.Argument(..., metavar="TARGET|WORKFLOW_ID"),
    step: str = typer.Argument(...),
    approver: str = typer.Option(None, "--as", help="who approves (default: $COLDSTART_USER or your login)"),
    comment: str = typer.Option("", "--comment", "-m"),
    identity_token: str | None = _OPT_IDENTITY_TOKEN,
    vault_login: bool = _OPT_VAULT_LOGIN,
    vault_addr: str | None = _OPT_VAULT_ADDR,
    identity_role: str = _OPT_IDENTITY_ROLE,
    vault_user: str | None = _OPT_VAULT_USER,
    vault_auth: str = _OPT_VAULT_AUTH,
    json_output: bool = typer.Option(False, "--json", help="the approval record as JSON"),
) -> None:
    """Approve a step that waits for approval (the same Update the Web UI sends)."""
    from workflows.contract import ApproveRequest

    approver = approver or _whoami()
    source, _ = _decision(run_ref, "approve", step, vault_login and identity_token is None, vault_auth)
    token = _identity_token(identity_token, vault_login, vault_addr, identity_role, vault_user, vault_auth, approver,
                            source)
    _say(_update(run_ref, "approve", _request(ApproveRequest, step=step, approver=approver, comment=comment,
                                              identity_token=token)), json_output)


def _control(name: str):
    def command(
        run_ref: str = typer.Argument(..., metavar="TARGET|WORKFLOW_ID"),
        step: str | None = typer.Argument(None, help="the held step (optional when only one is held)"),
        actor: str = typer.Option(None, "--as", help="who decides (default: $COLDSTART_USER or your login)"),
        reason: str = typer.Option("", "--reason", "-m"),
        identity_token: str | None = _OPT_IDENTITY_TOKEN,
        vault_login: bool = _OPT_VAULT_LOGIN,
        vault_addr: str | None = _OPT_VAULT_ADDR,
        identity_role: str = _OPT_IDENTITY_ROLE,
        vault_user: str | None = _OPT_VAULT_USER,
        vault_auth: str = _OPT_VAULT_AUTH,
        undo: bool = typer.Option(False, "--undo", hidden=name != "abort",
                                  help="undo what the run changed (newest first) before it ends; without it, the run "
                                       "says what it leaves in place"),
    ) -> None:
        from workflows.contract import ControlRequest

        if undo and name != "abort":
            _fail("--undo goes with abort only", EXIT_INVALID)
        actor = actor or _whoami()
        source, step = _decision(run_ref, name, step, vault_login and identity_token is None, vault_auth)
        token = _identity_token(identity_token, vault_login, vault_addr, identity_role, vault_user, vault_auth, actor,
                                source)
        fields = {"undo": True} if undo else {}
        _say(_update(run_ref, name, _request(ControlRequest, step=step, actor=actor, reason=reason,
                                             identity_token=token, **fields)))

    command.__doc__ = {
        "retry": "Retry a held step.",
        "skip": "Skip a held step and go on.",
        "abort": "Abort the run (a held or waiting step ends it at once; a running one first finishes).",
        "pause": "Pause before the next step.",
        "resume": "Resume a paused run.",
    }[name]
    return command


for _name in ("retry", "skip", "abort", "pause", "resume"):
    app.command(_name)(_control(_name))

identity_app = typer.Typer(no_args_is_help=True)
app.add_typer(identity_app, name="identity", help="Verified identity: tokens that prove who decides.")


@identity_app.command("token")
def identity_token_command(
    run_ref: str = typer.Argument(..., metavar="TARGET|WORKFLOW_ID"),
    verb: str = typer.Option(..., "--verb", help="approve, skip, retry, abort, pause or resume"),
    step: str | None = typer.Option(None, "--step", help="the step decided on (approve, skip, retry)"),
    who: str = typer.Option(None, "--as", help="your name (default: $COLDSTART_USER or your login)"),
    vault_login: bool = typer.Option(True, "--vault-login/--no-vault-login", hidden=True),
    vault_addr: str | None = _OPT_VAULT_ADDR,
    vault_user: str | None = _OPT_VAULT_USER,
    vault_auth: str = _OPT_VAULT_AUTH,
) -> None:
    """Print an identity token for one decision of a run, to paste as identity_token in the Web UI.

    The token is bound to this run, this step and this verb, and lives minutes: it serves nothing else."""
    if verb not in ("approve", "skip", "retry", "abort", "pause", "resume"):
        _fail(f"--verb {verb!r}: approve, skip, retry, abort, pause or resume", EXIT_INVALID)
    if verb == "approve" and not step:
        _fail("--verb approve needs --step", EXIT_INVALID)
    source, step = _decision(run_ref, verb, step, True, vault_auth)
    if source is None:
        _fail(f"{_workflow_id(run_ref)} binds no decision token (its runbook and target set no identity provider)",
              EXIT_INVALID)
    token = _identity_token(None, True, vault_addr, "", vault_user, vault_auth, who or _whoami(), source)
    sys.stdout.write(f"{token}\n")


@app.command()
def timeline(
    run_ref: str = typer.Argument(..., metavar="TARGET|WORKFLOW_ID"),
    run_id: str | None = typer.Option(None, help="a specific run (default: the latest)"),
    output_format: str = typer.Option("markdown", "--format", help="markdown or json"),
    json_output: bool = typer.Option(False, "--json", help="same as --format json"),
) -> None:
    """The run's timeline from its Temporal history: steps, actors, approvals, gate readings, durations."""
    from temporalio.service import RPCError

    from cli.timeline import build_timeline, render_markdown

    if output_format not in ("markdown", "json"):
        _fail("--format is markdown or json", EXIT_INVALID)

    async def go() -> None:
        client = await _client()
        fleet = await _fleet_status(client, run_ref) if run_id is None else None
        if fleet is not None:
            from cli.fleet import combined_timeline

            if json_output or output_format == "json":
                _print_json({**fleet.model_dump(mode="json"), "timelines": {
                    m.target: (await build_timeline(client, m.workflow_id, m.run_id)).to_json()
                    for m in fleet.members if m.run_id is not None}})
            else:
                sys.stdout.write(await combined_timeline(client, fleet, build_timeline, render_markdown))
            return
        try:
            result = await build_timeline(client, _workflow_id(run_ref), run_id)
        except RPCError as exc:
            await _no_such_run(client, run_ref, exc)
            _fail(f"{_workflow_id(run_ref)}: {exc.message}", EXIT_FAILED)
        if json_output or output_format == "json":
            _print_json(result.to_json())
        else:
            sys.stdout.write(render_markdown(result))

    _await(go())


@app.command()
def scorecard(
    run_ref: str = typer.Argument(..., metavar="TARGET|WORKFLOW_ID"),
    run_id: str | None = typer.Option(None, help="a specific run (default: the latest)"),
    json_output: bool = typer.Option(False, "--json"),
) -> None:
    """The run's scorecard: each phase of its runbook's objectives, the time measured, and what it waited on."""
    from temporalio.service import RPCError

    from cli.report import print_scorecard
    from cli.scorecard import score
    from cli.timeline import build_timeline

    async def go() -> None:
        client = await _client()
        try:
            card = score(await build_timeline(client, _workflow_id(run_ref), run_id))
        except RPCError as exc:
            await _no_such_run(client, run_ref, exc)
            _fail(f"{_workflow_id(run_ref)}: {exc.message}", EXIT_FAILED)
        if card is None:
            _fail(f"{_workflow_id(run_ref)}: its runbook states no objectives (add `objectives:` to score its runs)",
                  EXIT_INVALID)
        if json_output:
            _print_json(card.to_json())
        else:
            print_scorecard(out, card)

    _await(go())


@app.command()
def report(
    target: str = typer.Option(..., "--target", help="the target whose runs are compared"),
    runbook: str | None = typer.Option(None, "--runbook", help="only this runbook's runs (its metadata name)"),
    all_runs: bool = typer.Option(False, "--all", help="every finished run, not only drills"),
    limit: int = typer.Option(50, help="the newest this many runs"),
    png: Path | None = typer.Option(None, "--png", help="also draw each phase's time per run into this PNG"),
    kept_file: Path | None = typer.Option(
        None, "--file", help="read the scorecards kept in this file (a lab drill keeps them in "
                             ".state/drill/scorecards.jsonl) instead of the runs on Temporal"),
    json_output: bool = typer.Option(False, "--json"),
) -> None:
    """Recovery phases across drills: each run's time per phase against its objective, oldest first."""
    from cli.report import PlotUnavailable, collect, kept, plot_trend, print_trend

    async def go() -> None:
        if kept_file is not None:
            try:
                cards = kept(kept_file, target, runbook=runbook, limit=limit)
            except InvalidInput as exc:
                _fail(str(exc), EXIT_INVALID)
        else:
            cards = await collect(await _client(), target, runbook=runbook, drills_only=not all_runs, limit=limit)
        if not cards:
            _fail(f"no finished {'runs' if all_runs else 'drills'} on {target} whose runbook states objectives"
                  + ("" if all_runs else " (--all: every run)"), EXIT_FAILED)
        if json_output:
            _print_json([card.to_json() for card in cards])
        else:
            print_trend(out, cards)
        if png is not None:
            try:
                err.print(f"trend plot {plot_trend(cards, png)}", highlight=False)
            except PlotUnavailable as exc:
                _fail(str(exc), EXIT_INVALID)

    _await(go())


@app.command()
def server(
    db_file: Path = typer.Option(Path(".state/temporal.db"), help="persistent database file"),
    port: int = typer.Option(7233, help="the frontend's port"),
    ui_port: int = typer.Option(8233),
    ip: str = typer.Option("127.0.0.1"),
    postgres: bool = typer.Option(False, "--postgres", help="the real Temporal server on a private PostgreSQL "
                                  "(built once per machine), on loopback, no Web UI; runs until Ctrl-C"),
    state_dir: Path = typer.Option(Path(".state/cluster"), help="with --postgres: the database, config and logs"),
    inventory: Path | None = typer.Option(None, help="with --postgres: refuse a config depending on this "
                                             "inventory's Consul, Nomad or Vault"),
) -> None:
    """Run a local Temporal dev server with the Web UI, our search attributes and a persistent database."""
    if postgres:
        from runtime.cluster import ClusterError, serve
        from workflows.loader import read_inventory

        try:
            serve(state_dir, frontend_port=port, inventory=read_inventory(inventory) if inventory else None,
                  say=lambda line: err.print(line, highlight=False))
        except ClusterError as exc:
            _fail(str(exc), EXIT_FAILED)
        return
    from runtime.server_config import dev_server_argv

    db_file.parent.mkdir(parents=True, exist_ok=True)
    argv = dev_server_argv(db_file, port, ui_port=ui_port, ip=ip, log_level="warn")
    err.print(f"Temporal at {ip}:{port}, Web UI http://{ip}:{ui_port}, database {db_file}", highlight=False)
    os.execv(argv[0], argv)


@app.command("test")
def test_command(
    runbook: Path = typer.Argument(..., metavar="RUNBOOK", help="the runbook file"),
    cases: Path | None = typer.Argument(None, metavar="[CASES]",
                                        help="its cases file (default: cases/NAME.yaml beside the runbook)"),
    case: str | None = typer.Option(None, "--case", help="run only the case with this name"),
) -> None:
    """Test a runbook against its cases, in seconds and with no system touched.

    Each case runs the runbook on Temporal's time-skipping test server, so its waits, bakes and gate timeouts take no time. Every action answers what the case scripts (outputs or an error, in order), every gate reads the case's readings, and approvals and holds are decided by the people the case names.

    A line per case says PASS, or FAIL and what differed from the path the case expects: how the run ended, which steps succeeded, held, failed, were skipped or undone, where a ramp stepped back, which approvals were asked. Exit 0 when every case passes, 1 when one fails, 2 for a cases file that is not valid (each problem as file:line:col).
    """
    from cli.cases import test_runbook
    from runtime.case_runner import NoTestServer

    try:
        passed = test_runbook(runbook, cases, only=case, out=out)
    except LocatedErrors:
        raise  # every line printed by the command group
    except NoTestServer as exc:
        _fail(str(exc), EXIT_FAILED)
    except ValueError as exc:
        _fail(str(exc).splitlines()[0], EXIT_INVALID)
    if not passed:
        raise typer.Exit(EXIT_FAILED)


@app.command()
def schema(output: Path = typer.Option(Path("runbooks/runbook.schema.json"), "--output", "-o")) -> None:
    """Write the runbook JSON Schema (for editor autocompletion)."""
    from workflows.schema import runbook_json_schema

    output.write_text(json.dumps(runbook_json_schema(), indent=2) + "\n")
    out.print(f"wrote {output}", highlight=False)


@app.command()
def actions(
    name: str | None = typer.Argument(None, metavar="NAME", help="one action, or a namespace such as consul.kv"),
    json_output: bool = typer.Option(False, "--json", help="machine-readable reference"),
    markdown: bool = typer.Option(False, "--markdown", help="the Markdown page (coldstart actions --markdown > "
                                                            "docs/actions.md)"),
) -> None:
    """What a runbook step may call: each action's inputs (types, defaults, limits), output, undo, timeout, retry."""
    from activities.catalog import load_contracts
    from cli import actions as reference

    if json_output and markdown:
        _fail("--json or --markdown: give one of them", EXIT_INVALID)
    docs = reference.describe(load_contracts())
    chosen = docs
    if name:
        try:
            chosen = reference.lookup(docs, name)
        except reference.UnknownAction as exc:
            _fail(str(exc), EXIT_INVALID)
    one = chosen[0] if len(chosen) == 1 and chosen[0].name == name else None
    if json_output:
        _print_json(one.model_dump(mode="json") if one else [doc.model_dump(mode="json") for doc in chosen])
    elif markdown:
        sys.stdout.write(reference.to_markdown(chosen))
    elif one:
        reference.render_one(out, one)
    else:
        reference.render_table(out, chosen)


@app.command()
def readiness(
    file: Path = typer.Argument(..., metavar="RUNBOOK", help="the runbook file"),
    target: str | None = typer.Option(None, help="inventory name (default: the runbook's target)"),
    param: list[str] = typer.Option([], "--param", "-p", help="NAME=VALUE (JSON values accepted); unset ones stay "
                                                               "unresolved and what needs them is not checked"),
    json_output: bool = typer.Option(False, "--json", help="machine-readable result"),
    metrics_file: Path | None = typer.Option(
        None, "--metrics-file", help="write coldstart_readiness{runbook,target,check} here (1 ready, 0 not ready, "
                                     "-1 unknown) for node_exporter's textfile collector"),
    push: str | None = typer.Option(None, "--push", metavar="URL", help="push the metrics to this Pushgateway"),
    timeout: float = typer.Option(10.0, min=0.1, help="seconds each check may take before it says unknown "
                                                      "(reading a snapshot: at least 120)"),
    temporal_config: Path | None = typer.Option(
        None, "--temporal-config", help="the Temporal server's config YAML, checked for Consul, Nomad or Vault too"),
    schedule: str | None = typer.Option(
        None, "--schedule", metavar="CRON", help="instead of checking now, check on this cron (e.g. '0 6 * * *') on a "
                                                "worker: its catalog's runbook, from its host; its metrics go where the "
                                                "worker's $COLDSTART_READINESS_METRICS_DIR and $COLDSTART_READINESS_PUSH "
                                                "say"),
    trial_restore: bool = typer.Option(False, "--trial-restore", help="also restore the newest Consul snapshot into a "
                                                                      "scratch agent and compare its key count (weekly)"),
) -> None:
    """Check, on an ordinary day, the recovery path a runbook will need: ready, not ready or unknown, with evidence.

    The checks come from the planned run: workers polling its queue with this catalog's actions, the Temporal
    frontend, this host's resolver and the gates' telemetry independent of Consul, Nomad and Vault (the live
    Prometheus config), every endpoint reachable from here, every secret resolving (never printed), the DNS
    steering key accepted, Nomad's room for each job redeployed from scratch, the newest Consul snapshot younger
    than the target's facts.rpo, verified and decoded (and, with --trial-restore, restored into a scratch agent).
    Exit 0 all ready, 1 any not ready, 3 any unknown (none not ready), 2 invalid input. See docs/readiness.md.
    """
    from cli.readiness import readiness_report, render_report, settings_for
    from runtime.connection import task_queue

    planned = _plan(file, param, target, placeholders=True)
    if schedule:
        if metrics_file is not None or push is not None:
            # The request a Schedule starts names no file or URL: where a worker writes is its own configuration.
            _fail("--metrics-file and --push go with a check run here; a scheduled check's metrics go where its worker "
                  "says ($COLDSTART_READINESS_METRICS_DIR, $COLDSTART_READINESS_PUSH)", EXIT_INVALID)
        _schedule_readiness(planned, param, schedule, timeout, trial_restore)
        return
    try:
        settings = settings_for(task_queue(), timeout=timeout, temporal_config=temporal_config,
                                trial_restore=trial_restore)
        report = _await(readiness_report(planned, settings, metrics_file=metrics_file, push=push,
                                         command=f"coldstart readiness {file} --target {planned.target_name}"))
    except (OSError, ValueError) as exc:  # an unreadable config, a bad facts.rpo, an unwritable metrics file
        _fail(str(exc).splitlines()[0], EXIT_INVALID)
    if json_output:
        _print_json(report.as_json())
    else:
        render_report(out, report)
    raise typer.Exit(report.exit_code)


def _schedule_readiness(planned: Any, param: list[str], cron: str, timeout: float, trial_restore: bool) -> None:
    from cli.schedules import schedule_readiness
    from runtime.connection import task_queue
    from workflows.readiness import ReadinessRequest

    request = ReadinessRequest(runbook=planned.runbook.metadata.name, target=planned.target_name,
                               params=_params(param), timeout_seconds=timeout, trial_restore=trial_restore)

    async def go() -> None:
        client = await _client()
        try:
            handle = await schedule_readiness(client, request, task_queue(), cron)
        except Exception as exc:  # noqa: BLE001 - e.g. a cron expression the server rejects
            _fail(f"cannot create the schedule: {str(exc).splitlines()[0]}", EXIT_INVALID)
        out.print(f"schedule {handle.id}: readiness of {request.runbook} on {request.target} at '{cron}'; each "
                  f"check's report is its workflow's result", highlight=False, soft_wrap=True)

    _await(go())


@app.command()
def drill(
    args: list[str] = typer.Argument(..., metavar="NAME | schedule NAME", help="run a drill now, or `schedule NAME --cron ...`"),
    interactive: bool = typer.Option(False, help="approve in the Web UI instead of the drill approver"),
    state_dir: Path = typer.Option(Path(".state/drill"), help="where logs, databases and the report go"),
    cron: str | None = typer.Option(None, help="with `schedule`: a cron expression, e.g. '0 14 * * 3'"),
    file: Path | None = typer.Option(None, "--runbook", help="with `schedule`: the runbook file (default runbooks/NAME.yaml)"),
    target: str | None = typer.Option(None, help="with `schedule`: the inventory (default: the runbook's target)"),
    paused: bool = typer.Option(False, help="with `schedule`: create it paused"),
    keep: bool = typer.Option(False, help="leave the lab up after a lab drill (for a look around)"),
) -> None:
    """Run a drill end to end on this machine and report (exit 0 only if it succeeded), or schedule one."""
    if args[0] == "schedule":
        if len(args) != 2 or not cron:
            _fail("usage: coldstart drill schedule NAME --cron 'MIN HOUR DOM MON DOW'", EXIT_INVALID)
        _schedule(args[1], cron, file, target, paused)
        return
    if len(args) != 1:
        _fail("usage: coldstart drill NAME", EXIT_INVALID)
    from workflows.loader import RunbookInvalid

    run_drill = _plugin("drill")
    try:
        succeeded = run_drill(args[0], state_dir, out, interactive=interactive, keep=keep)
    except RunbookInvalid as exc:
        _fail(exc.errors[0] + (f" (and {len(exc.errors) - 1} more)" if len(exc.errors) > 1 else ""), EXIT_INVALID)
    except InvalidInput as exc:  # DrillNotFound: the message lists the drills there are
        _fail(str(exc), EXIT_INVALID)
    raise typer.Exit(0 if succeeded else EXIT_FAILED)


def _schedule(name: str, cron: str, file: Path | None, target: str | None, paused: bool) -> None:
    from cli.schedules import DrillTargetRefused, schedule_drill
    from runtime.connection import task_queue
    from workflows.names import NameRefused, named_file

    if file is None:
        try:
            file = named_file(Path("runbooks"), "runbook", name)
        except NameRefused as exc:
            _fail(str(exc), EXIT_INVALID)
    run = _plan(file, [], target, drill=True)

    async def go() -> None:
        client = await _client()
        try:
            handle = await schedule_drill(client, run, task_queue(), cron, paused=paused)
        except DrillTargetRefused as exc:
            _fail(str(exc), EXIT_INVALID)
        except Exception as exc:  # noqa: BLE001 - e.g. a cron expression the server rejects
            _fail(f"cannot create the schedule: {str(exc).splitlines()[0]}", EXIT_INVALID)
        out.print(f"schedule {handle.id}: {run.runbook.metadata.name} on {run.target_name} at '{cron}'"
                  f"{' (paused)' if paused else ''}; see it under Schedules in the Web UI", highlight=False)

    _await(go())


def _mount_worker() -> None:
    from cli.seal_keys import seal_keys_app
    from cli.units import install_units_command
    from cli.worker_cmd import worker_app

    app.add_typer(worker_app, name="worker", help="Run a worker (same as `python worker.py`); promote its versions.")
    app.add_typer(seal_keys_app, name="seal-keys", help="The workers' keys that seal what runs hand on.")
    app.command("install-units")(install_units_command)


_mount_worker()


PLUGIN_GROUP = "coldstart.plugins"


def _plugin(name: str) -> Any:
    """What the drill lab contributes (`coldstart lab`, `coldstart drill NAME`), found through the package's
    entry points: the controller never imports the lab, and an install without it says what is missing."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        found = {ep.name: ep for ep in distribution("coldstart").entry_points if ep.group == PLUGIN_GROUP}
    except PackageNotFoundError:
        found = {}
    if name not in found:
        _fail(f"`coldstart {name}` comes with the drill lab, which this install lacks (pip install 'coldstart[lab]')",
              EXIT_INVALID)
    try:
        return found[name].load()
    except ImportError as exc:
        _fail(f"`coldstart {name}` needs the drill lab's packages (pip install 'coldstart[lab]'): {exc}", EXIT_INVALID)


def _mount_lab(argv: list[str]) -> None:
    """Mount `coldstart lab` when it is asked for or listed; other commands never load the lab."""
    if argv[:1] == ["lab"] or not argv or argv[0] in ("--help", "-h"):
        try:
            lab_app = _plugin("lab")
        except CliError:
            if argv[:1] == ["lab"]:
                raise
            return
        app.add_typer(lab_app, name="lab", help="The drill lab: a platform to recover on this machine.")


def _mount_triggers() -> None:
    triggers_app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)

    @triggers_app.command("serve")
    def triggers_serve(
        config: Path = typer.Option(Path("triggers/lab.yaml"), "--config", help="the triggers file"),
        host: str = typer.Option("127.0.0.1", help="listen address"),
        port: int = typer.Option(9095, help="listen port"),
        token_file: Path = typer.Option(..., "--token-file", help="the bearer token Alertmanager sends"),
        targets_dir: Path | None = typer.Option(None, "--targets-dir",
                                                   help="inventories (default: $COLDSTART_TARGETS or targets)"),
        state: Path | None = typer.Option(None, "--state", help="a file keeping the firings acted on, so a "
                                                                   "repeated alert starts nothing after a restart"),
        tls_cert: Path | None = typer.Option(None, "--tls-cert", help="serve https with this certificate (PEM)"),
        tls_key: Path | None = typer.Option(None, "--tls-key", help="and its private key (PEM)"),
    ) -> None:
        """Answer Alertmanager's webhook: allow-listed alerts start their runbook (POST /alerts)."""
        from triggers.receiver import serve

        try:
            serve(config, host, port, token_file, targets_dir or _targets_dir(), state=state, tls_cert=tls_cert,
                  tls_key=tls_key)
        except LocatedErrors:
            raise  # every line printed by _run
        except ValueError as exc:
            _fail(str(exc).splitlines()[0], EXIT_INVALID)
        except OSError as exc:  # e.g. the port is taken
            _fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}", EXIT_FAILED)

    @triggers_app.command("check")
    def triggers_check(config: Path = typer.Argument(..., help="the triggers file")) -> None:
        """Check a triggers file and the runbooks it names; problems as file:line:col: message (exit 2)."""
        from triggers.receiver import check

        checked = check(config)
        out.print(f"{config}: ok ({len(checked.triggers)} trigger{'s' if len(checked.triggers) != 1 else ''})",
                  highlight=False)

    app.add_typer(triggers_app, name="triggers", help="Alert-triggered runs: an Alertmanager webhook receiver.")


_mount_triggers()


def main() -> None:
    code = _run()
    # The command is finished and its output written. Temporal's native core keeps threads that
    # can call into Python while the interpreter finalizes (seen: SIGABRT, "PyGILState_Release:
    # thread state must be current ... finalizing", after a successful `coldstart run`), so leave
    # without finalizing rather than let the exit code turn into a crash.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run() -> int:
    try:
        _mount_lab(sys.argv[1:])
        code = app(standalone_mode=False)
        return code if isinstance(code, int) else 0
    except CliError as exc:
        if str(exc):
            err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        return exc.code
    except typer.Exit as exc:
        return exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except (typer.Abort, KeyboardInterrupt):
        err.print("interrupted")
        return 130
    except Exception as exc:  # usage errors and the like: one line, exit 2
        if isinstance(exc, _usage_errors()):
            # Both kinds (Typer's and click's usage errors) have format_message.
            message = exc.format_message()  # pyright: ignore[reportAttributeAccessIssue]
            err.print(f"error: {message}", markup=False, highlight=False)
            return EXIT_INVALID
        raise


def _usage_errors() -> tuple[type[Exception], ...]:
    """Typer >= 0.2x raises its own TyperException subclasses; earlier ones raised click's."""
    found: list[type[Exception]] = []
    if (typer_error := getattr(typer.exceptions, "TyperException", None)) is not None:
        found.append(typer_error)
    try:
        import click  # pyright: ignore[reportMissingImports] - there only with a Typer that does not vendor it

        found.append(click.ClickException)
    except ImportError:
        pass
    return tuple(found)


if __name__ == "__main__":
    main()

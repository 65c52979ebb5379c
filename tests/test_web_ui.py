"""The Temporal Web UI approves a waiting step: Debian's chromium, driven by Playwright, sends the Update."""

from __future__ import annotations

import asyncio
import json
import re
import shutil

import hvac
import pytest

from lab.hashistack.local import VaultDev
from lab.identity import configure_identity
from tests import support
from tests.real import needs

ROOT = "web-ui-root"
BOB_PASSWORD = "bob-pw"

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--headless=new", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]

pytestmark = [
    pytest.mark.browser,
    needs(shutil.which("chromium"), "Debian's chromium is not installed (make test installs it)"),
]


async def _awaiting(handle):
    return "restore" in (await support.status(handle)).awaiting_approval


async def test_approve_from_the_web_ui(env, task_queue, tmp_path, ui_port, monkeypatch):
    """The page the Web UI opens a run on (its timeline) says who may approve, the command, the Update's name and
    input and how to get the identity token, without a click; doing exactly that (a token bound to this run,
    step and verb, from the real Vault's OIDC provider) approves the step."""
    from playwright.async_api import async_playwright
    from typer.testing import CliRunner

    from cli.main import app

    vault = VaultDev(tmp_path / "vault", ROOT).start()
    try:
        setup = configure_identity(hvac.Client(url=vault.url, token=ROOT), {"bob": BOB_PASSWORD})
        out = tmp_path / "out.txt"
        book = support.write_runbook(tmp_path, f"""
            metadata: {{name: ui-approval}}
            target: t
            approvers: [bob]
            identity: {{vault: "{vault.url}", audience: {setup["client_id"]}, provider: {setup["provider"]}}}
            steps:
              - id: restore
                approval: {{prompt: "restore the snapshot from 14:05?"}}
              - id: after
                action: test.append
                with: {{path: "{out}", label: after}}
        """)
        async with support.worker(env.client, task_queue):
            handle = await support.start(env.client, book, task_queue, target={"name": f"ui-{task_queue}"})
            await support.wait_for(lambda: _awaiting(handle))
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    page = await browser.new_page(viewport={"width": 1400, "height": 1000})
                    await page.goto(f"http://127.0.0.1:{ui_port}/namespaces/default/workflows/{handle.id}")
                    # No tab clicked: the UI opens on the timeline, where each pending timer shows its summary.
                    await _command_on_page(page, r"restore: awaits approval; may approve: bob; restore the snapshot from 14:05\?")
                    assert page.url.endswith("/timeline"), page.url
                    await page.screenshot(path=str(tmp_path / "first-page.png"))
                    cli = await _command_on_page(page, r"coldstart approve (\S+) restore --vault-login")
                    assert cli.group(1) == f"ui-{task_queue}"
                    update = await _command_on_page(page, r"Send an Update, approve, input (\{.*\})")
                    command = await _command_on_page(page, r"coldstart identity token (\S+) --verb approve "
                                                           r"--step restore --vault-login")
                    assert command.group(1) == handle.id
                    monkeypatch.setenv("TEMPORAL_ADDRESS", env.client.service_client.config.target_host)
                    monkeypatch.setenv("VAULT_PASSWORD", BOB_PASSWORD)
                    monkeypatch.setenv("VAULT_ADDR", vault.url)  # the approver logs in at their own Vault only
                    printed = await asyncio.to_thread(CliRunner().invoke, app, [
                        *command.group(0).split()[1:], "--as", "bob"])
                    assert printed.exit_code == 0, (printed.output, printed.exception)
                    token = printed.stdout.strip()

                    await page.get_by_role("button", name="More Actions").click()
                    await page.get_by_role("menuitem", name="Send an Update").click()
                    dialog = page.locator("dialog[open]")
                    await dialog.get_by_test_id("update-select-button").click()
                    await dialog.get_by_role("option", name="approve", exact=True).click()
                    editor = dialog.locator(".cm-content")
                    await editor.click()
                    # The input as the page shows it, with the token pasted where it says.
                    shown = json.loads(update.group(1))
                    assert shown == {"step": "restore", "approver": "bob", "comment": "", "identity_token": "PASTE"}
                    await page.keyboard.insert_text(json.dumps({**shown, "comment": "from the UI", "identity_token": token}))
                    # The form submits only once it has an update id.
                    await dialog.get_by_role("button", name="Random UUID").click()
                    await dialog.get_by_role("button", name="Submit").click()
                    await support.wait_for(lambda: _done(handle), timeout=30)
                    await page.screenshot(path=str(tmp_path / "after-approval.png"))
                finally:
                    await browser.close()
            await handle.result()
            status = await support.status(handle)
    finally:
        vault.stop()
    approval = status.steps[0].approvals[0]
    assert (approval.approver, approval.comment, approval.subject) == ("bob", "from the UI", setup["users"]["bob"])
    assert support.lines(out)[-1].endswith("after")


async def _command_on_page(page, pattern: str, timeout: float = 30) -> re.Match:
    """The first match of `pattern` in the text of the page or any of its frames, waiting up to `timeout` s."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        for frame in page.frames:
            try:
                found = re.search(pattern, await frame.locator("body").inner_text(timeout=2000))
            except Exception:  # noqa: BLE001, S112 - a frame detached while the page re-renders
                continue
            if found:
                return found
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no {pattern!r} on the run's page or its frames")
        await asyncio.sleep(0.5)


async def _done(handle):
    return (await support.status(handle)).state == "succeeded"

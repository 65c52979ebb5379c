"""The Temporal Web UI approves a waiting step: Debian's chromium, driven by Playwright, sends the Update."""

from __future__ import annotations

import json
import shutil

import pytest

from tests import support

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--headless=new", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not shutil.which("chromium"), reason="Debian's chromium is not installed (make test installs it)"),
]


async def _awaiting(handle):
    return "restore" in (await support.status(handle)).awaiting_approval


async def test_approve_from_the_web_ui(env, task_queue, tmp_path, ui_port):
    from playwright.async_api import async_playwright

    out = tmp_path / "out.txt"
    book = support.write_runbook(tmp_path, f"""
        metadata: {{name: ui-approval}}
        target: t
        approvers: [bob]
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
                await page.get_by_role("button", name="More Actions").click()
                await page.get_by_role("menuitem", name="Send an Update").click()
                dialog = page.locator("dialog[open]")
                await dialog.get_by_test_id("update-select-button").click()
                await dialog.get_by_role("option", name="approve", exact=True).click()
                editor = dialog.locator(".cm-content")
                await editor.click()
                await page.keyboard.insert_text(json.dumps({"step": "restore", "approver": "bob", "comment": "from the UI"}))
                # The form submits only once it has an update id.
                await dialog.get_by_role("button", name="Random UUID").click()
                await dialog.get_by_role("button", name="Submit").click()
                await support.wait_for(lambda: _done(handle), timeout=30)
                await page.screenshot(path=str(tmp_path / "after-approval.png"))
            finally:
                await browser.close()
        await handle.result()
        status = await support.status(handle)
    approval = status.steps[0].approvals[0]
    assert (approval.approver, approval.comment) == ("bob", "from the UI")
    assert support.lines(out)[-1].endswith("after")


async def _done(handle):
    return (await support.status(handle)).state == "succeeded"

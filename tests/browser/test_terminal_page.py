"""The terminal page in Chromium against real daphne, worker and Redis: what a person sees and can do."""

from __future__ import annotations

import re
import signal

import pytest
from playwright.async_api import Page, expect

from tests.browser.conftest import SCREENSHOTS

# Not transactional: the module's servers share data committed outside the tests' transactions
# (see `committed` in conftest.py); the mark only has the test database set up.
pytestmark = [pytest.mark.browser, pytest.mark.django_db, pytest.mark.asyncio(loop_scope="module")]

TERMINAL_URL = re.compile(r"/terminals/[0-9a-f-]{36}/$")


async def log_in(page: Page, username: str, password: str) -> None:
    await page.goto("/")
    await expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/$"))
    await page.fill("#id_username", username)
    await page.fill("#id_password", password)
    await page.click("form.login button[type=submit]")
    await expect(page.locator("h1")).to_have_text("My workspaces")


async def open_workspace(page: Page, machine: str) -> None:
    await page.locator(f'tr[data-machine="{machine}"] button:has-text("Open")').click()
    await expect(page).to_have_url(TERMINAL_URL)
    await wait_live(page)


async def wait_live(page: Page) -> None:
    """Attached and the replay drawn: from here on keys reach the shell."""
    await expect(page.locator("#terminal-status")).to_have_text("Connected")
    await page.wait_for_function(
        "() => { const s = window.tetherTerminal.state(); return s.phase === 'live' && !s.replaying; }"
    )


async def run(page: Page, command: str) -> None:
    await page.locator("#terminal").click()
    await page.keyboard.type(command)
    await page.keyboard.press("Enter")


async def screen_text(page: Page) -> str:
    return await page.evaluate("window.tetherTerminal.text()")


async def wait_for_text(page: Page, pattern: str, count: int = 1) -> re.Match:
    """Wait until ``pattern`` (a JS-compatible regex) matches ``count`` times on screen; return the last match."""
    await page.wait_for_function(
        "([source, count]) => (window.tetherTerminal.text().match(new RegExp(source, 'gm')) || []).length >= count",
        arg=[pattern, count],
    )
    return list(re.finditer(pattern, await screen_text(page), re.M))[-1]


async def test_open_from_my_workspaces_and_run_a_command(page, host_machine):
    await log_in(page, "operator", "operator-password")
    row = page.locator(f'tr[data-machine="{host_machine}"]')
    await expect(row).to_contain_text("no open terminal")
    if SCREENSHOTS:
        await page.screenshot(path=SCREENSHOTS / "workspaces.png")
    await open_workspace(page, host_machine)
    await run(page, "echo tether-$((6*7))")
    await wait_for_text(page, r"^tether-42$")
    assert "tether-$((6*7))" in await screen_text(page)  # the echoed command line, once
    await expect(page.locator("#terminal-durability")).to_be_hidden()  # a held shell outlives the worker
    if SCREENSHOTS:
        await run(page, "printf '\\033[1;32mgreen\\033[0m and https://example.com/docs\\n'; ls /")
        await wait_for_text(page, r"^green and")
        await page.screenshot(path=SCREENSHOTS / "terminal.png")
    await page.goto("/")
    await expect(row).to_contain_text("live")


async def test_copy_takes_the_whole_buffer_and_clear_wipes_only_this_screen(page, context, base_url, host_machine):
    await context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base_url)
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    await run(page, "echo copy-$((5*5))")
    await wait_for_text(page, r"^copy-25$")
    await page.click("#terminal-copy")
    await expect(page.locator("#terminal-notice")).to_have_text("Copied the whole buffer")
    assert re.search(r"^copy-25$", await page.evaluate("navigator.clipboard.readText()"), re.M)

    await page.click("#terminal-clear")
    await page.wait_for_function("() => !window.tetherTerminal.text().includes('copy-25')")
    await run(page, "echo still-$((6*6))")  # the shell itself is untouched
    await wait_for_text(page, r"^still-36$")


async def test_reload_resumes_the_same_shell_with_its_output(page, host_machine):
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    await run(page, 'echo "pid:$$:"')
    pid = (await wait_for_text(page, r"pid:(\d+):")).group(1)
    stored = await page.evaluate(
        "JSON.parse(sessionStorage.getItem('tether.terminal.' + window.tetherTerminal.client.config.session))"
    )
    assert stored["generation"] == 1 and stored["offset"] > 0

    await page.reload()
    await wait_live(page)
    assert f"pid:{pid}:" in await screen_text(page)  # replayed from the worker's buffer
    await run(page, 'echo "pid:$$:"')
    second = await wait_for_text(page, r"pid:(\d+):", count=2)
    assert second.group(1) == pid  # the same shell, not a new one
    # Nothing typed before the reload was sent again.
    assert (await screen_text(page)).count('echo "pid:$$:"') == 2


async def test_a_second_tab_supersedes_the_first_which_keeps_its_frame_and_can_take_over(page, context, host_machine):
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    await run(page, "echo first-$((1+1))")
    await wait_for_text(page, r"^first-2$")

    second = await context.new_page()
    await second.goto(page.url)
    await wait_live(second)
    await wait_for_text(second, r"^first-2$")  # the same shell's history

    await expect(page.locator("#terminal-status")).to_have_text("Superseded by another window")
    frame = await screen_text(page)
    takeover = page.locator("#terminal-takeover")
    await expect(takeover).to_be_visible()
    await run(page, "echo should-not-arrive")  # dropped while superseded
    await run(second, "echo second-$((2+2))")
    await wait_for_text(second, r"^second-4$")
    assert await screen_text(page) == frame  # the superseded window keeps its last frame, untouched
    assert "first-2" in frame

    await takeover.click()
    await wait_live(page)
    await expect(takeover).to_be_hidden()
    await expect(second.locator("#terminal-status")).to_have_text("Superseded by another window")
    await wait_for_text(page, r"^second-4$")  # output produced while superseded is caught up
    await expect(page.locator("#terminal-notice")).to_contain_text("typed while disconnected were not sent")
    await run(page, "echo back-$((2+3))")
    await wait_for_text(page, r"^back-5$")
    assert "should-not-arrive" not in await screen_text(page)


async def test_keys_typed_while_the_server_is_down_are_dropped_and_reported(page, stack, host_machine):
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    await run(page, 'echo "pid:$$:"')
    pid = (await wait_for_text(page, r"pid:(\d+):")).group(1)

    daphne = next(process for process in stack.daphnes if process.poll() is None)
    daphne.send_signal(signal.SIGKILL)  # an abrupt loss, not a polite close
    daphne.wait()
    await expect(page.locator("#terminal-status")).to_have_text("Reconnecting to your session…")
    await run(page, "echo typed-while-away")
    await stack_start_daphne_on(stack, stack.ports[0])

    await wait_live(page)
    await expect(page.locator("#terminal-notice")).to_have_text(
        re.compile(r"^\d+ keys typed while disconnected were not sent$")
    )
    await run(page, 'echo "pid:$$:"')
    assert (await wait_for_text(page, r"pid:(\d+):", count=2)).group(1) == pid
    assert "typed-while-away" not in await screen_text(page)


async def test_exit_shows_the_exit_code_and_a_new_shell_can_be_started(page, host_machine):
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    await run(page, 'echo "pid:$$:"')
    pid = (await wait_for_text(page, r"pid:(\d+):")).group(1)
    await run(page, "exit 7")
    await expect(page.locator("#terminal-status")).to_have_text("Exited with code 7")
    new_shell = page.locator("#terminal-new-shell")
    await expect(new_shell).to_be_visible()

    await new_shell.click()
    await wait_live(page)
    await wait_for_text(page, r"\[previous shell: Exited with code 7\]")
    await run(page, 'echo "pid:$$:"')
    assert (await wait_for_text(page, r"pid:(\d+):")).group(1) != pid


async def test_reset_asks_first_then_starts_a_fresh_shell(page, host_machine):
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    await run(page, 'echo "pid:$$:"')
    pid = (await wait_for_text(page, r"pid:(\d+):")).group(1)
    dialog = page.locator("#reset-dialog")

    await page.click("#terminal-reset")
    await expect(dialog).to_be_visible()
    await dialog.locator('button[value="cancel"]').click()
    await expect(dialog).to_be_hidden()
    assert f"pid:{pid}:" in await screen_text(page)  # cancelled: nothing happened

    await page.click("#terminal-reset")
    await dialog.locator('button[value="reset"]').click()
    await page.wait_for_function("() => window.tetherTerminal.state().generation === 2")
    await wait_live(page)
    assert f"pid:{pid}:" not in await screen_text(page)  # the old shell's screen is cleared
    await run(page, 'echo "pid:$$:"')
    assert (await wait_for_text(page, r"pid:(\d+):")).group(1) != pid


async def test_a_resize_reattaches_with_the_new_grid_without_repeating_output(page, host_machine):
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    await run(page, "echo once-$((3*3))")
    await wait_for_text(page, r"^once-9$")
    before = await page.evaluate("window.tetherTerminal.state()")

    await page.set_viewport_size({"width": 760, "height": 460})
    await page.wait_for_function(f"() => window.tetherTerminal.state().cols < {before['cols']}")
    await wait_live(page)
    grid = await page.evaluate("window.tetherTerminal.state()")
    assert grid["rows"] < before["rows"] and grid["generation"] == before["generation"]
    await run(page, "stty size")
    await wait_for_text(page, rf"^{grid['rows']} {grid['cols']}$")
    assert len(re.findall(r"^once-9$", await screen_text(page), re.M)) == 1  # resumed by offset, not replayed


async def stack_start_daphne_on(stack, port: int) -> None:
    from asgiref.sync import sync_to_async

    await sync_to_async(stack.start_daphne, thread_sensitive=False)(port)


async def test_a_user_cannot_open_another_users_session(page, context, browser, base_url, host_machine):
    from django.contrib.auth import get_user_model

    from tests.browser.conftest import committed

    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    url = page.url
    committed(
        lambda: (
            get_user_model().objects.filter(username="mallory").exists()
            or get_user_model().objects.create_user(username="mallory", password="mallory-password")
        )
    )
    other = await browser.new_context(base_url=base_url)
    try:
        intruder = await other.new_page()
        await log_in(intruder, "mallory", "mallory-password")
        response = await intruder.goto(url)
        assert response.status == 404  # the same answer as for a session that does not exist
        await expect(intruder.locator("#terminal")).to_have_count(0)
        await expect(intruder.locator(f'tr[data-machine="{host_machine}"]')).to_have_count(0)
    finally:
        await other.close()


async def test_admin_kill_then_the_session_shows_an_archived_snapshot(page, browser, base_url, host_machine):
    from django.contrib.auth import get_user_model

    from terminals.models import TerminalSession
    from tests.browser.conftest import committed

    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    await run(page, "echo kill-me-$((2*21))")
    await wait_for_text(page, r"^kill-me-42$")
    session_id = page.url.rstrip("/").rsplit("/", 1)[1]
    committed(
        lambda: (
            get_user_model().objects.filter(username="root").exists()
            or get_user_model().objects.create_superuser(username="root", password="root-password", email="")
        )
    )
    admin_context = await browser.new_context(base_url=base_url, viewport={"width": 1100, "height": 900})
    try:
        admin = await admin_context.new_page()
        await admin.goto("/admin/login/")
        await admin.fill("#id_username", "root")
        await admin.fill("#id_password", "root-password")
        await admin.click("input[type=submit]")
        await admin.goto("/admin/terminals/terminalsession/")
        await admin.locator(f'input[name="_selected_action"][value="{session_id}"]').check()
        options = await admin.locator('select[name="action"] option').evaluate_all(
            "options => options.map(o => [o.value, o.textContent])"
        )
        kill = next(value for value, text in options if text.startswith("Kill"))
        await admin.select_option('select[name="action"]', kill)
        await admin.click('button[name="index"]')
        await expect(admin.locator("body")).to_contain_text("Kill the session's process tree")
        await admin.fill("#id_reason", "browser test: runaway shell")
        await admin.click('input[type=submit][value="Yes, I\'m sure"]')
        # The user is told who ended their shell, and why.
        await expect(page.locator("#terminal-status")).to_have_text(
            re.compile(r"^Closed by \w+, who killed it \(browser test: runaway shell\)$"), timeout=30_000
        )
        await admin.goto(f"/admin/terminals/terminalsession/{session_id}/change/")
        await expect(admin.locator(".field-snapshot_kind .readonly")).to_have_text("Archived")
        await expect(admin.locator("pre")).to_contain_text("kill-me-42")
        if SCREENSHOTS:
            await admin.screenshot(path=SCREENSHOTS / "admin-session.png", full_page=True)
        closed = committed(lambda: TerminalSession.objects.get(pk=session_id))
        assert (closed.snapshot_kind, closed.close_reason) == ("archived", "killed")
    finally:
        await admin_context.close()

"""The command rail and the reconnect message, in Chromium against the real servers: each typed command
listed with how it ended; after a reload during a running command the page says it is still running, and
after it ends, how it ended; a click on a command scrolls to its output."""

from __future__ import annotations

import re

import pytest
from playwright.async_api import expect

from tests.browser.test_terminal_page import log_in, open_workspace, run, wait_for_text, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.django_db, pytest.mark.asyncio(loop_scope="module")]


async def open_the_rail(page) -> None:
    """Click Commands: the rail takes columns, so the page reattaches with its new grid; wait for that."""
    cols = await page.evaluate("window.tetherTerminal.state().cols")
    await page.locator("#terminal-commands-toggle").click()
    await page.wait_for_function("(cols) => window.tetherTerminal.state().cols < cols", arg=cols)
    await wait_live(page)


async def last_notice(page) -> str:
    return await page.evaluate("window.tetherTerminal.notices().at(-1) || ''")


async def test_the_rail_lists_commands_and_a_reload_says_what_became_of_the_last(page, host_machine):
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    rail = page.locator("#terminal-command-list")
    # Closed by default below 1280 px (it would take too many columns); opened, it stays open.
    await expect(page.locator("#terminal-commands")).to_be_hidden()
    await open_the_rail(page)
    await expect(page.locator("#terminal-commands")).to_be_visible()
    await expect(page.locator("#terminal-commands-off")).to_be_hidden()
    await run(page, "true")
    await run(page, "(exit 2)")
    await run(page, "seq 1 300")
    await wait_for_text(page, r"^300$")
    await expect(rail.locator("li")).to_have_count(3)
    await expect(rail.locator("li").nth(0)).to_have_attribute("data-state", "exited")
    await expect(rail.locator("li").nth(1)).to_have_attribute("data-state", "failed")
    await expect(rail.locator("li").nth(1).locator(".meta")).to_contain_text("exit 2")

    # A click on a command scrolls back to its output; the latest output is far below it now.
    await rail.locator("li").nth(0).locator("button").click()
    scrolled = await page.evaluate(
        "(() => { const b = window.tetherTerminal.term.buffer.active; return [b.viewportY, b.baseY]; })()"
    )
    assert scrolled[0] < scrolled[1], scrolled

    await run(page, "sleep 3; echo slept")
    running = rail.locator("li").nth(3)
    await expect(running).to_have_attribute("data-state", "running")
    await page.reload()
    await wait_live(page)
    await page.wait_for_function("() => (window.tetherTerminal.notices().at(-1) || '').includes('still running')")
    assert re.fullmatch(
        r"`sleep 3; echo slept` is still running \(started \d\d:\d\d( [AP]M)?\)", await last_notice(page)
    )
    await expect(page.locator("#terminal-command-list li").nth(3)).to_have_attribute("data-state", "running")

    await wait_for_text(page, r"^slept$")
    await expect(page.locator("#terminal-command-list li").nth(3)).to_have_attribute("data-state", "exited")
    await page.reload()
    await wait_live(page)
    await page.wait_for_function("() => (window.tetherTerminal.notices().at(-1) || '').includes('exited')")
    assert re.fullmatch(r"`sleep 3; echo slept` exited with code 0 at \d\d:\d\d( [AP]M)?", await last_notice(page))

    # The workspace list shows the last command's state.
    await page.goto("/")
    cell = page.locator(f'tr[data-machine="{host_machine}"] td.last-command')
    await expect(cell).to_contain_text("sleep 3; echo slept")
    await expect(cell).to_contain_text("exited 0")


async def test_a_shell_without_tracking_says_so(page, stack):
    from executions.actions import Actor, add_machine
    from tests.browser.conftest import committed

    committed(add_machine, name="quiet-box", backend="local", scope="team-a", actor=Actor.command("tests"),
              track_commands=False)  # fmt: skip
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, "quiet-box")
    await open_the_rail(page)
    off = page.locator("#terminal-commands-off")
    await expect(off).to_be_visible()
    await expect(off).to_have_text("Commands are not being tracked: shell integration is off for this machine.")
    await run(page, "echo works-$((3*3))")
    await wait_for_text(page, r"^works-9$")  # the shell works exactly as before
    await expect(page.locator("#terminal-command-list li")).to_have_count(0)


async def test_the_rail_follows_a_command_whose_outcome_became_unknown(page, host_machine):
    """The holder killed under `sleep 600; echo finished`: the badge said the outcome was unknown while the rail
    went on saying "running since …"; back on the page, the rail was empty (fetched only on `attached`, and an
    unknown session is never attached again). The rail follows the record: unknown, with why."""
    import os
    import signal

    from terminals.models import ProcessLease, TerminalSession
    from tests.browser.conftest import committed

    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    await open_the_rail(page)
    await run(page, "sleep 600; echo finished")
    command = page.locator("#terminal-command-list li").last
    await expect(command).to_have_attribute("data-state", "running")
    session_id = page.url.rstrip("/").rpartition("/")[2]

    def holder_pid() -> int:
        session = TerminalSession.objects.get(pk=session_id)
        return ProcessLease.objects.get(execution_id=session.execution_id).handle.holder.process.pid

    os.kill(committed(holder_pid), signal.SIGKILL)
    await expect(page.locator("#terminal-status")).to_contain_text("outcome unknown", timeout=30_000)
    await expect(command).to_have_attribute("data-state", "unknown")  # it said "running since …"
    await expect(command.locator(".meta")).to_contain_text("outcome unknown: the shell's session ended first")
    await page.reload()
    back = page.locator("#terminal-command-list li").last  # the list was empty
    await expect(back).to_have_attribute("data-state", "unknown")
    await expect(back.locator("code")).to_have_text("sleep 600; echo finished")


async def test_a_command_that_ends_while_the_list_is_fetched_stays_in_the_rail(page, host_machine):
    """The rail's list is fetched at each attach and kept current by the socket's `command` messages. A command
    whose message came while the fetch was on its way (the list built before it ran) vanished from the rail
    when the older list arrived: seen in CI as 2 of 3 commands listed. The fetch is held here until it has."""
    import asyncio

    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    await open_the_rail(page)
    release = asyncio.Event()

    async def hold(route):
        response = await route.fetch()  # the list as it is before the command runs
        await release.wait()
        await route.fulfill(response=response)

    await page.route("**/commands/", hold)
    await page.reload()
    await wait_live(page)
    rail = page.locator("#terminal-command-list li")
    await run(page, "true")
    await expect(rail).to_have_count(1)  # from the socket's message
    await expect(rail.nth(0)).to_have_attribute("data-state", "exited")
    async with page.expect_response("**/commands/"):
        release.set()
    await page.unroute("**/commands/")
    await run(page, "(exit 2)")
    await expect(rail.nth(1)).to_have_attribute("data-state", "failed")
    await expect(rail).to_have_count(2)  # the older list did not take `true` away
    await expect(rail.nth(0).locator("code")).to_have_text("true")

"""Watching in Chromium: a read-only observer beside the writer, a share link that works, expires and is revoked
at once, and a recorded session played back to the same final screen as the live one."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.utils import timezone
from playwright.async_api import Page, expect

from executions.actions import Actor, add_machine
from recordings import actions
from recordings.models import ShareLink
from terminals.models import SessionEvent, TerminalSession
from tests.browser.conftest import SCREENSHOTS, committed
from tests.browser.test_terminal_page import log_in, open_workspace, run, wait_for_text
from tests.factories import grant

pytestmark = [pytest.mark.browser, pytest.mark.django_db, pytest.mark.asyncio(loop_scope="module")]

# People who are not staff open host shells here.
STACK_ENV = {"TETHER_HOST_SHELLS_FOR_ALL": "1", "TETHER_RECORDING_FLUSH_SECONDS": "1"}


@pytest.fixture(scope="module")
def people(stack, django_db_blocker):
    def create() -> None:
        users = get_user_model().objects
        users.create_user(username="alice", password="alice-password")
        users.create_user(username="bob", password="bob-password")
        watcher = users.create_user(username="watcher", password="watcher-password", is_staff=True)
        watcher.user_permissions.add(Permission.objects.get(codename="observe_terminalsession"))

    with django_db_blocker.unblock():
        committed(create)


def new_machine(name: str) -> str:
    """A host machine alice and bob use (host shells are open to everyone here: STACK_ENV)."""
    machine = committed(add_machine, name=name, backend="local", scope="team-a", actor=Actor.command("tests"))
    for person in ("alice", "bob"):
        committed(lambda person=person: grant(get_user_model().objects.get(username=person), machine))
    return name


async def grid(page: Page) -> tuple[int, int]:
    state = await page.evaluate("window.tetherTerminal.state()")
    return state["cols"], state["rows"]


async def wait_watching(page: Page) -> None:
    await expect(page.locator("#terminal-foreign")).to_contain_text("shell read-only")
    # The page's text is there before its script has run (a loaded machine is slow to start it): wait for both.
    await page.wait_for_function(
        "() => { const s = window.tetherTerminal?.state(); return s?.phase === 'live' && s.role === 'observer'; }"
    )


async def test_an_observer_sees_the_shell_cannot_type_keeps_the_writers_grid_and_the_writer_sees_it(
    browser, base_url, people
):
    machine = new_machine("watched-box")
    writer_context = await browser.new_context(base_url=base_url, viewport={"width": 1100, "height": 680})
    # A smaller window: it draws the writer's grid scaled down, never its own.
    watcher_context = await browser.new_context(base_url=base_url, viewport={"width": 760, "height": 460})
    try:
        alice, watcher = await writer_context.new_page(), await watcher_context.new_page()
        await log_in(alice, "alice", "alice-password")
        await open_workspace(alice, machine)
        await run(alice, "echo before-$((1+1)); stty size")
        await wait_for_text(alice, r"^before-2$")
        size_before = (await wait_for_text(alice, r"^\d+ \d+$")).group(0)

        await log_in(watcher, "watcher", "watcher-password")
        await watcher.locator(f'tr[data-machine="{machine}"] button:has-text("Watch")').click()
        await wait_watching(watcher)
        await wait_for_text(watcher, r"^before-2$")  # what came before it joined
        await expect(alice.locator("#terminal-watchers")).to_have_text("Watched by watcher")
        assert await grid(watcher) == await grid(alice)
        scale = await watcher.evaluate("window.tetherTerminal.term.element.style.transform")
        assert scale.startswith("scale("), scale  # the writer's wider grid, fitted into the smaller window

        await run(alice, "echo during-$((2+3))")
        await wait_for_text(watcher, r"^during-5$")
        if SCREENSHOTS:
            await alice.screenshot(path=SCREENSHOTS / "watched.png")
            await watcher.screenshot(path=SCREENSHOTS / "watching.png")
        await run(watcher, "echo typed-by-watcher")
        await expect(watcher.locator("#terminal-notice")).to_contain_text("read-only")
        await run(alice, "stty size; echo after-$((3+4))")
        await wait_for_text(alice, r"^after-7$")
        assert "typed-by-watcher" not in await alice.evaluate("window.tetherTerminal.text()")
        sizes = re.findall(r"^\d+ \d+$", await alice.evaluate("window.tetherTerminal.text()"), re.M)
        assert sizes == [size_before, size_before]  # the observer changed nothing of the writer's grid
        assert await grid(watcher) == await grid(alice)

        await watcher.close()
        await expect(alice.locator("#terminal-watchers")).to_be_hidden()
    finally:
        await writer_context.close()
        await watcher_context.close()


async def test_a_share_link_shows_the_live_shell_until_it_is_revoked(browser, base_url, people):
    machine = new_machine("shared-box")
    contexts = [await browser.new_context(base_url=base_url) for _ in range(2)]
    try:
        alice, bob = [await context.new_page() for context in contexts]
        await log_in(alice, "alice", "alice-password")
        await open_workspace(alice, machine)
        await alice.click("#terminal-share")
        await alice.locator("#share-create").click()
        address = await alice.locator("#new-share-link").input_value()
        if SCREENSHOTS:
            await alice.screenshot(path=SCREENSHOTS / "share.png")
        assert re.search(r"/shares/[A-Za-z0-9_-]{40,}/$", address), address

        await log_in(bob, "bob", "bob-password")
        await bob.goto(address)
        await wait_watching(bob)
        await expect(bob.locator("#terminal-foreign")).to_contain_text("Shared by alice")
        await expect(alice.locator("#terminal-watchers")).to_have_text("Watched by bob (share link)")
        await alice.keyboard.press("Escape")  # the dialog closes; the shell is typed into again
        await run(alice, "echo shared-$((6+1))")
        await wait_for_text(bob, r"^shared-7$")

        await alice.click("#terminal-share")
        await alice.locator("tr[data-share] button:has-text('Revoke')").click()
        await expect(alice.locator("#share-panel")).to_contain_text("was revoked")
        await expect(bob.locator("#terminal-status")).to_have_text("This share link was revoked", timeout=3000)
        response = await bob.goto(address)
        assert response.status == 404
        session = committed(lambda: TerminalSession.objects.get(machine__name=machine))
        kinds = committed(lambda: list(SessionEvent.objects.filter(session=session).values_list("kind", flat=True)))
        assert {"share_created", "share_opened", "observed", "share_revoked"} <= set(kinds)
    finally:
        for context in contexts:
            await context.close()


async def test_a_share_link_closes_the_page_when_it_expires(browser, base_url, people, settings):
    settings.TETHER_HOST_SHELLS_FOR_ALL = True  # as the servers are (STACK_ENV): the link is made here
    machine = new_machine("expiring-box")
    contexts = [await browser.new_context(base_url=base_url) for _ in range(2)]
    try:
        alice, bob = [await context.new_page() for context in contexts]
        await log_in(alice, "alice", "alice-password")
        await open_workspace(alice, machine)

        def short_link() -> str:
            session = TerminalSession.objects.get(machine__name=machine)
            link, token = actions.create_share_link(session.user, session)
            ShareLink.objects.filter(pk=link.pk).update(expires_at=timezone.now() + timedelta(seconds=4))
            return token

        token = committed(short_link)
        await log_in(bob, "bob", "bob-password")
        await bob.goto(f"/shares/{token}/")
        await wait_watching(bob)
        await expect(bob.locator("#terminal-status")).to_have_text("This share link has expired", timeout=10_000)
        assert (await bob.goto(f"/shares/{token}/")).status == 404
    finally:
        for context in contexts:
            await context.close()


LIVE_SCREEN = """() => {
  const buffer = window.tetherTerminal.term.buffer.active;
  const rows = [];
  for (let y = buffer.baseY; y < buffer.baseY + window.tetherTerminal.term.rows; y++) {
    rows.push((buffer.getLine(y)?.translateToString(true) ?? "").replace(/\\s+$/, ""));
  }
  while (rows.length && rows[rows.length - 1] === "") rows.pop();
  return rows.join("\\n");
}"""


async def test_a_recorded_session_plays_back_to_the_same_final_screen(page, people):
    machine = new_machine("recorded-box")
    await log_in(page, "alice", "alice-password")
    await open_workspace(page, machine)
    await run(page, "printf '\\033[1;32mgreen\\033[0m plain\\n'; seq 1 40 | paste -sd' '")
    await run(page, "echo final-$((6*7))")
    await wait_for_text(page, r"^final-42$")
    await run(page, "exit 7")
    await expect(page.locator("#terminal-status")).to_have_text("Exited with code 7")
    live = await page.evaluate(LIVE_SCREEN)
    assert "final-42" in live

    await page.goto("/")
    await page.locator(f'tr[data-machine="{machine}"] a:has-text("Recordings")').click()
    row = page.locator("tr[data-recording]").first
    await expect(row).to_contain_text("Exited with code 7", timeout=15_000)  # saved once the shell ended
    await row.locator("a:has-text('Play')").click()
    await expect(page.locator("#recording-outcome")).to_have_text("Exited with code 7")
    markers = page.locator("#recording-markers button")
    await expect(markers.first).to_contain_text("printf")
    await expect(markers.nth(1)).to_contain_text("echo final-$((6*7))")
    await page.wait_for_function("() => window.tetherPlayer && window.tetherPlayer.duration() > 0")
    await page.evaluate("window.tetherPlayer.toEnd()")
    played = ""
    for _ in range(100):  # the player draws the end a moment after the seek
        if (played := await page.evaluate("window.tetherPlayer.text()")) == live:
            break
        await page.wait_for_timeout(100)
    assert played == live
    await page.set_viewport_size({"width": 600, "height": 700})  # a narrow window: the player above its commands
    box = await page.locator("#player").bounding_box()
    assert box and box["width"] > 500, box
    await page.set_viewport_size({"width": 1100, "height": 680})
    if SCREENSHOTS:
        await page.screenshot(path=SCREENSHOTS / "recording.png", full_page=True)

"""The page as people meet it after something went wrong, on other screens, and with the habits other terminals
gave them: no internal retries shown, an unknown outcome said plainly, take-over by staff told and audited,
phones, visible underscores, find, font size, copy and paste."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import override_settings
from playwright.async_api import Page, expect
from playwright.async_api import TimeoutError as PlaywrightTimeout

from executions.actions import Actor, add_machine
from recordings.models import Recording
from terminals.models import SessionEvent, TerminalSession, ViewerPreference
from tests.browser.conftest import committed
from tests.browser.test_terminal_page import log_in, open_workspace, run, screen_text, wait_for_text, wait_live
from tests.factories import grant

pytestmark = [pytest.mark.browser, pytest.mark.django_db, pytest.mark.asyncio(loop_scope="module")]

# A person who is not staff opens a host shell here; and a staff member takes it over.
STACK_ENV = {"TETHER_HOST_SHELLS_FOR_ALL": "1"}


@pytest.fixture(scope="module")
def people(stack, django_db_blocker):
    def create() -> None:
        users = get_user_model().objects
        users.create_user(username="alice", password="alice-password")
        helper = users.create_user(username="helper", password="helper-password", is_staff=True)
        helper.user_permissions.add(Permission.objects.get(codename="takeover_terminalsession"))

    with django_db_blocker.unblock():
        committed(create)


def new_machine(name: str) -> str:
    """A host machine alice's team uses (host shells are open to everyone here: STACK_ENV)."""
    machine = committed(add_machine, name=name, backend="local", scope="team-a", actor=Actor.command("tests"))
    for alice in committed(lambda: list(get_user_model().objects.filter(username="alice"))):
        committed(grant, alice, machine)
    return name


async def test_coming_back_to_an_exited_shell_shows_none_of_the_servers_own_retries(page, host_machine):
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    await run(page, "exit 3")
    await expect(page.locator("#terminal-status")).to_have_text("Exited with code 3")
    await page.reload()  # coming back: the server reports the exit and starts a fresh shell
    await wait_live(page)
    await run(page, "echo fresh-$((2+3))")
    await wait_for_text(page, r"^fresh-5$")
    notices = await page.evaluate("window.tetherTerminal.notices()")
    assert not [text for text in notices if "does not hold" in text or text.startswith("Server:")], notices


async def test_take_over_puts_the_next_keys_into_the_terminal(page, context, host_machine):
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    url = page.url
    second = await context.new_page()
    await second.goto(url)
    await wait_live(second)
    await expect(page.locator("#terminal-status")).to_have_text("Superseded by another window")
    await page.bring_to_front()
    await page.click("#terminal-takeover")
    await wait_live(page)
    await page.keyboard.type("echo typed-$((6*7))")  # no click into the terminal first
    await page.keyboard.press("Enter")
    await wait_for_text(page, r"^typed-42$")


async def underscore_pixels(page: Page) -> tuple[int, int]:
    """Lit pixels in the first row (a line of underscores) and in an empty row of the same size."""
    rows = page.locator(".xterm-rows > div")
    counts = []
    for index in (0, 5):
        box = await rows.nth(index).bounding_box()
        shot = await page.screenshot(clip=box)
        counts.append(await page.evaluate(LIT_PIXELS, list(shot)))
    return counts[0], counts[1]


# Counts the pixels of a PNG brighter than the terminal's background, decoding it in the page.
LIT_PIXELS = """async (bytes) => {
  const blob = new Blob([new Uint8Array(bytes)], { type: "image/png" });
  const image = await createImageBitmap(blob);
  const canvas = new OffscreenCanvas(image.width, image.height);
  const context = canvas.getContext("2d");
  context.drawImage(image, 0, 0);
  const data = context.getImageData(0, 0, image.width, image.height).data;
  let lit = 0;
  for (let i = 0; i < data.length; i += 4) if (data[i] + data[i + 1] + data[i + 2] > 240) lit++;
  return lit;
}"""


@pytest.mark.parametrize("scale", [1, 2])
async def test_underscores_are_visible_on_ordinary_and_dense_screens(browser, base_url, scale):
    context = await browser.new_context(
        base_url=base_url, viewport={"width": 900, "height": 500}, device_scale_factor=scale
    )
    try:
        # Added before the list is loaded: a machine added after it would appear only at its 15 s refresh.
        machine = new_machine(f"underscores-{scale}")
        page = await context.new_page()
        sockets = []
        page.on("websocket", lambda ws: sockets.append(ws.url))
        await log_in(page, "operator", "operator-password")
        await open_workspace(page, machine)
        await page.wait_for_timeout(500)
        assert len(sockets) == 1, sockets  # no reconnect right after the page came up
        # The screen and scrollback cleared, a row of underscores at the top, nothing else drawn.
        await run(page, "printf '\\033[2J\\033[3J\\033[H%s\\n' ________________________________; sleep 30")
        await page.wait_for_function("() => window.tetherTerminal.text().startsWith('____')")
        underscores, empty = await underscore_pixels(page)
        assert empty == 0 and underscores > 30 * scale, (underscores, empty)
    finally:
        await context.close()


async def test_staff_write_into_another_users_shell_only_with_the_permission_and_the_user_is_told(
    browser, base_url, people
):
    machine = new_machine("shared-dev")
    contexts = [await browser.new_context(base_url=base_url) for _ in range(3)]
    try:
        alice, operator, helper = [await context.new_page() for context in contexts]
        await log_in(alice, "alice", "alice-password")
        await open_workspace(alice, machine)
        shell_url = alice.url

        # Staff who may use every workspace but not watch others' shells: the list says one is open, never whose;
        # opening it is refused, saying so; its page does not exist for them.
        await log_in(operator, "operator", "operator-password")
        row = operator.locator(f'tr[data-machine="{machine}"]')
        await expect(row).to_contain_text("in use by another user")
        await row.locator("button").click()
        await expect(operator.locator(".messages")).to_contain_text("in use by another user's shell")
        refused = await operator.goto(shell_url)
        assert refused.status == 404 and "alice" not in await refused.text()

        # Staff with it: they watch first, read-only (alice is not superseded by being watched, and sees who
        # watches); writing into it is a click of its own, told to alice and recorded.
        await log_in(helper, "helper", "helper-password")
        row = helper.locator(f'tr[data-machine="{machine}"]')
        await expect(row).to_contain_text("alice's shell, live")
        await row.locator('button:has-text("Watch")').click()
        await expect(helper.locator("#terminal-foreign")).to_contain_text("You are watching alice's shell read-only")
        await expect(helper.locator("#terminal-status")).to_have_text("Connected")
        await expect(alice.locator("#terminal-status")).to_have_text("Connected")
        await expect(alice.locator("#terminal-watchers")).to_have_text("Watched by helper")
        await helper.click("#terminal-takeover")
        await wait_live(helper)
        await expect(alice.locator("#terminal-status")).to_have_text("Taken over by helper")
        await run(helper, "echo helped-$((40+2))")
        await wait_for_text(helper, r"^helped-42$")
        event = committed(lambda: SessionEvent.objects.filter(kind="taken_over").select_related("user").last())
        assert (event.user.username, event.detail["owner"]) == ("helper", "alice")
        # Alice takes it back: the same plain take-over, and helper is told. Helper's watching ended with its
        # take-over, so nobody is listed as watching; and alice is told who wrote into her shell.
        await alice.click("#terminal-takeover")
        await wait_live(alice)
        await expect(helper.locator("#terminal-status")).to_have_text("Taken over by alice")
        await expect(alice.locator("#terminal-watchers")).to_be_hidden()
        await expect(alice.locator("#terminal-notice")).to_contain_text("helper took over this shell")
        # The recording says when the shell changed hands.
        session = committed(lambda: TerminalSession.objects.get(machine__name=machine, process_state="live"))
        marked = lambda: any("helper writes" in label for _, label in Recording.objects.get(session=session).markers)  # noqa: E731
        for _ in range(50):
            if committed(marked):
                break
            await asyncio.sleep(0.1)
        assert committed(marked)
    finally:
        for context in contexts:
            await context.close()


async def test_on_a_phone_nothing_scrolls_sideways_and_touch_keys_send_what_the_keyboard_lacks(browser, base_url):
    phone = {"width": 390, "height": 844}
    context = await browser.new_context(
        base_url=base_url, viewport=phone, is_mobile=True, has_touch=True, device_scale_factor=2
    )
    try:
        page = await context.new_page()
        machine = new_machine("pocket-box")
        await log_in(page, "operator", "operator-password")
        assert await page.evaluate("document.documentElement.scrollWidth") <= phone["width"]
        await open_workspace(page, machine)
        assert await page.evaluate("document.documentElement.scrollWidth") <= phone["width"]
        await page.locator("#terminal-tools-toggle").tap()  # on a phone the tools are a menu
        for button in ("#terminal-reset", "#terminal-clear", "#terminal-copy"):
            box = await page.locator(button).bounding_box()
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= phone["width"], (button, box)
        keys = page.locator("#touch-keys")
        await expect(keys).to_be_visible()
        await run(page, "cat -vT")  # shows Esc as ^[ and Tab as ^I
        for key in ("escape", "tab", "up"):
            await keys.locator(f'[data-key="{key}"]').tap()
        await page.keyboard.press("Enter")
        await wait_for_text(page, r"^\^\[\^I\^\[\[A$")
        await keys.locator('[data-key="ctrl"]').tap()
        await page.keyboard.type("c")  # Ctrl armed: the next key is Ctrl+C, which ends cat
        await run(page, "echo after-$((1+1))")
        await wait_for_text(page, r"^after-2$")
    finally:
        await context.close()


async def test_find_font_size_and_the_copy_and_paste_keys_people_expect(browser, base_url, context, page):
    await context.grant_permissions(["clipboard-read", "clipboard-write"])
    machine = new_machine("habits-box")
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, machine)
    await run(page, "printf 'needle-%s\\n' 1 2 3")
    await wait_for_text(page, r"^needle-3$")

    # Find in the scrollback (Ctrl+Shift+F), the match selected.
    await page.keyboard.press("Control+Shift+F")
    await expect(page.locator("#terminal-search-text")).to_be_focused()
    await page.keyboard.type("needle-2")
    await page.keyboard.press("Enter")
    assert await page.evaluate("window.tetherTerminal.term.getSelection()") == "needle-2"
    await page.keyboard.press("Escape")
    await expect(page.locator("#terminal-search")).to_be_hidden()

    # Ctrl+C with a selection copies it and sends no interrupt; Ctrl+V pastes.
    await page.evaluate("window.tetherTerminal.term.selectLines(0, 0)")
    selected = await page.evaluate("window.tetherTerminal.term.getSelection()")
    await page.locator("#terminal").click()
    await page.evaluate("window.tetherTerminal.term.selectLines(0, 0)")
    await page.keyboard.press("Control+c")
    assert await page.evaluate("navigator.clipboard.readText()") == selected
    await page.evaluate("navigator.clipboard.writeText('echo pasted-$((5+5))')")
    await page.keyboard.press("Control+v")
    await page.keyboard.press("Enter")
    await wait_for_text(page, r"^pasted-10$")
    assert "^C" not in await screen_text(page)

    # The font size follows the person: larger text, fewer columns, and the same after a reload.
    cols = await page.evaluate("window.tetherTerminal.state().cols")
    await page.click("#terminal-larger")
    await page.click("#terminal-larger")
    await page.wait_for_function(f"() => window.tetherTerminal.state().cols < {cols}")
    await wait_live(page)
    await page.wait_for_timeout(800)  # the size is saved a moment after the last click
    assert committed(lambda: ViewerPreference.objects.get(user__username="operator").font_size) == 16
    await page.reload()
    await wait_live(page)
    assert await page.evaluate("window.tetherTerminal.term.options.fontSize") == 16
    await run(page, "echo still-$((3*3))")
    await wait_for_text(page, r"^still-9$")


@contextlib.asynccontextmanager
async def own_host(browser, host: str, **env: str):
    """Servers of a host of their own (so that only its workers, not the module's, run its shells), and a
    logged-in page in front of them, open on a fresh local machine of that host. Yields (stack, worker, page)."""
    from tests.bridge.harness import Stack

    own = Stack(
        extra_env={"TETHER_SHELL": "/bin/bash,--noprofile,--norc", "TETHER_HOST": host,
                   "TETHER_SESSIONS_PER_USER": "100", **env}
    )  # fmt: skip
    context = None
    try:
        await asyncio.to_thread(own.start_daphne)
        worker = await asyncio.to_thread(own.start_worker, "local")
        context = await browser.new_context(base_url=f"http://127.0.0.1:{own.ports[0]}")
        page = await context.new_page()
        committed(add_machine, name=f"{host}-box", backend="local", host=host, actor=Actor.command("tests"))
        await log_in(page, "operator", "operator-password")
        await open_workspace(page, f"{host}-box")
        yield own, worker, page
    finally:
        if context is not None:
            await context.close()
        own.stop()


async def test_after_an_unknown_outcome_the_page_says_why_and_once_resolved_a_new_shell_starts(
    browser, stack, django_db_blocker
):
    """The worker holding a plain local shell (no session holder) is killed: its PTY dies with it and the
    outcome is unknown. The page says so, and why no new shell starts; once an operator has resolved it,
    one does."""
    from tests.bridge.harness import wait_for

    env = {"TETHER_RECOVERY_SECONDS": "1", "TETHER_VIEWER_CHECK_SECONDS": "1", "TETHER_HOLDER": "0"}
    async with own_host(browser, "lost-host", **env) as (own, owner, page):
        machine = "lost-host-box"
        shell_url = page.url
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        await asyncio.to_thread(own.start_worker, "local")
        await expect(page.locator("#terminal-status")).to_have_text("Connection lost; outcome unknown", timeout=40_000)
        await expect(page.locator("#terminal-warning")).to_contain_text("until an operator has checked it")
        await page.click("#terminal-reopen button")
        await expect(page.locator(".messages")).to_contain_text("An operator must check it and resolve it first")

        from executions.models import Execution, State
        from terminals.resolution import resolve

        def resolve_it():
            lost = wait_for(lambda: Execution.objects.filter(machine__name=machine, state=State.UNKNOWN).first())
            return resolve(lost, actor=Actor.command("tests"), note="worker killed; its PTY is gone")[0]

        with django_db_blocker.unblock(), override_settings(TETHER_HOST="lost-host"):
            assert committed(resolve_it).state == State.RESOLVED
        await page.goto(shell_url)
        await wait_live(page)
        await wait_for_text(page, re.escape("[previous shell: Resolved: outcome unknown]"))
        await run(page, "echo again-$((4+4))")
        await wait_for_text(page, r"^again-8$")


async def test_a_shell_ended_by_its_workers_restart_says_so(browser, stack):
    """A plain local shell (no session holder) cannot outlive its worker: stopped cleanly (a deploy), the
    worker ends it, and the page says that this is what happened, not merely "Killed"."""
    async with own_host(browser, "restart-host", TETHER_HOLDER="0") as (_, worker, page):
        worker.send_signal(signal.SIGTERM)
        await asyncio.to_thread(worker.wait, 30)
        await expect(page.locator("#terminal-status")).to_have_text(
            "Ended: the Tether worker holding it was stopped, and a shell like this cannot outlive it"
        )


async def test_a_held_shell_outlives_its_workers_kill_and_the_page_comes_back_to_it_by_itself(
    browser, stack, django_db_blocker
):
    """The worker holding a held local shell is killed (SIGKILL): the next worker adopts the shell from its
    session holder, and the page, untouched, is connected to the same shell again with its screen."""
    env = {"TETHER_RECOVERY_SECONDS": "1", "TETHER_VIEWER_CHECK_SECONDS": "1"}
    async with own_host(browser, "held-host", **env) as (own, worker, page):
        await run(page, "echo shell-$$-before")
        pid = (await wait_for_text(page, r"^shell-(\d+)-before$")).group(1)
        worker.send_signal(signal.SIGKILL)
        await asyncio.to_thread(worker.wait, 30)
        await asyncio.to_thread(own.start_worker, "local")
        from executions.models import Evidence, ExecutionEvent
        from tests.bridge.harness import wait_for

        with django_db_blocker.unblock():
            adopted = ExecutionEvent.objects.filter(execution__machine__name="held-host-box", evidence=Evidence.ADOPTED)
            await asyncio.to_thread(wait_for, adopted.exists, 40, "the shell to be adopted")
        # The page finds the new owner by itself (its server checks every second); a person who typed in the
        # moment between would type again.
        for _ in range(10):
            await wait_live(page)
            await run(page, "echo shell-$$-after")
            try:
                await page.wait_for_function(
                    "(source) => new RegExp(source, 'm').test(window.tetherTerminal.text())",
                    arg=rf"^shell-{pid}-after$",
                    timeout=2000,
                )
                break
            except PlaywrightTimeout:
                continue
        else:
            raise AssertionError(f"the page never reached its shell again: {await screen_text(page)}")
        await expect(page.locator("#terminal-durability")).to_be_hidden()
        assert f"shell-{pid}-before" in await screen_text(page)  # the screen it had, not a fresh one

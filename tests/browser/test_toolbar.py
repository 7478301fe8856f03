"""The terminal page's bar at a phone's width and at a laptop's, in Chromium: nothing runs past the screen, the
workspace's name and the state's explanation stay whole, and the tools fold into a menu first. Before: at 390 px
the tools ran past the screen (Share ended at 446 px); at 1280 px after an unknown outcome the name was cut to
one letter and the explanation ("Tether lost th…") to a few words."""

from __future__ import annotations

import os
import signal

import pytest
from playwright.async_api import Page, expect

from terminals.models import ProcessLease, TerminalSession
from tests.browser.conftest import committed
from tests.browser.test_terminal_page import log_in, open_workspace

pytestmark = [pytest.mark.browser, pytest.mark.django_db, pytest.mark.asyncio(loop_scope="module")]

BAR_WORDS = "#terminal-page .terminal-bar .machine-name, #terminal-status, #terminal-warning"

# Each visible thing in the bar: its right edge, and whether its text is cut (wider or taller than its box).
GEOMETRY = """(selector) => [...document.querySelectorAll(selector)]
  .filter((el) => el.offsetParent !== null && getComputedStyle(el).visibility !== "hidden")
  .map((el) => ({ id: el.id || el.className, right: el.getBoundingClientRect().right, text: el.textContent.trim(),
                  cut: el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1 }))"""


async def layout(page: Page, selector: str) -> list[dict]:
    return await page.evaluate(GEOMETRY, selector)


async def assert_fits(page: Page, width: int) -> None:
    everything = await layout(page, ".terminal-bar *")
    assert [item for item in everything if item["right"] > width + 0.5] == [], everything
    assert await page.evaluate("document.documentElement.scrollWidth") <= width
    words = await layout(page, BAR_WORDS)
    assert [item for item in words if item["cut"]] == [], words


def kill_holder(session_id: str) -> None:
    session = TerminalSession.objects.get(pk=session_id)
    os.kill(ProcessLease.objects.get(execution_id=session.execution_id).handle.holder.process.pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "viewport",
    [{"width": 390, "height": 844}, {"width": 1280, "height": 800}],
    ids=["phone-390", "laptop-1280"],
)
async def test_the_bar_keeps_the_name_and_the_explanation_whole_and_folds_the_tools(
    browser, base_url, host_machine, viewport
):
    phone = viewport["width"] < 640
    context = await browser.new_context(base_url=base_url, viewport=viewport, is_mobile=phone, has_touch=phone)
    try:
        page = await context.new_page()
        await log_in(page, "operator", "operator-password")
        await open_workspace(page, host_machine)
        await assert_fits(page, viewport["width"])
        toggle = page.locator("#terminal-tools-toggle")
        if phone:  # folded: every tool is one tap away, on the screen
            await expect(toggle).to_be_visible()
            await toggle.click()
            for tool in ("#terminal-find", "#terminal-copy", "#terminal-reset", "#terminal-share"):
                await expect(page.locator(tool)).to_be_visible()
            await assert_fits(page, viewport["width"])
            await page.locator("#terminal-find").click()  # a tool used: the menu closes, the tool works
            await expect(page.locator("#terminal-search")).to_be_visible()
            await expect(page.locator("#terminal-copy")).to_be_hidden()
            await page.keyboard.press("Escape")
        else:  # room enough: the tools are in the bar
            await expect(toggle).to_be_hidden()
            await expect(page.locator("#terminal-share")).to_be_visible()

        # The outcome becomes unknown: its explanation is the one sentence the user needs, and it stays whole.
        committed(kill_holder, page.url.rstrip("/").rpartition("/")[2])
        await expect(page.locator("#terminal-status")).to_contain_text("outcome unknown", timeout=30_000)
        await expect(page.locator("#terminal-warning")).to_contain_text("Tether lost the worker")
        await page.wait_for_timeout(200)  # the bar measured again
        await assert_fits(page, viewport["width"])
        name = await page.locator(".terminal-bar .machine-name").text_content()
        assert name == host_machine
    finally:
        await context.close()

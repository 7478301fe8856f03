"""The page with no screens kept (TETHER_SCREEN_SCROLLBACK=0, said whatever the default): a reload past the buffer
gets the kept tail, and the page says the screen may be incomplete."""

from __future__ import annotations

import re

import pytest
from playwright.async_api import expect

from tests.browser.test_terminal_page import log_in, open_workspace, run, screen_text, wait_for_text, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.django_db, pytest.mark.asyncio(loop_scope="module")]

STACK_ENV = {"TETHER_SCREEN_SCROLLBACK": "0"}


async def test_heavy_output_keeps_flowing_and_a_reload_says_what_was_lost(page, host_machine):
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    # ~1.1 MB: more than the worker lets through unacknowledged (192 KiB) and than it buffers (256 KiB here),
    # in long lines so that the replayed 256 KiB fits in xterm's scrollback with the "lost" line on top.
    gap = page.locator("#terminal-gap")
    await expect(gap).to_be_hidden()  # nothing was lost: nothing is said
    await run(page, "yes $(printf '%0100d' 0) | head -n 11000; echo done-$((4*4))")
    await wait_for_text(page, r"^done-16$")
    await page.reload()
    await wait_live(page)
    text = await screen_text(page)
    assert re.search(r"^\[\.\.\. \d+ bytes of earlier output were lost \.\.\.\]$", text, re.M)
    assert re.search(r"^done-16$", text, re.M)
    # Said where the program's repaint cannot overwrite it, until dismissed.
    await expect(gap).to_be_visible()
    said = await page.locator("#terminal-gap-text").text_content()
    assert re.fullmatch(r"Reconnected: \d+ KB of earlier output are not kept; the screen may be incomplete .*", said)
    await run(page, "clear")
    await expect(gap).to_be_visible()
    await page.click("#terminal-gap-close")
    await expect(gap).to_be_hidden()

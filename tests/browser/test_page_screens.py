"""The page itself, with the worker keeping local shells' screens: a reload past the buffer draws the screen the
worker kept, then the kept bytes, and says what happened in a line that stays."""

from __future__ import annotations

import re

import pytest
from playwright.async_api import expect

from tests.browser.test_terminal_page import log_in, open_workspace, run, screen_text, wait_for_text, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.django_db, pytest.mark.asyncio(loop_scope="module")]

STACK_ENV = {"TETHER_SCREEN_SCROLLBACK": "200"}  # off by default: on for this module's stack


async def test_a_reload_past_the_buffer_draws_the_screen_the_worker_kept_and_says_so(page, host_machine):
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    gap = page.locator("#terminal-gap")
    # ~1.1 MB through a 256 KiB buffer, then a full-screen program's frame in the alternate screen.
    await run(page, "yes $(printf '%0100d' 0) | head -n 11000; echo done-$((4*4))")
    await wait_for_text(page, r"^done-16$")
    await run(page, r"printf '\033[?1049h\033[H\033[2J\033[7m header of the program \033[0m\r\nbody\r\n'; sleep 30")
    await wait_for_text(page, r"header of the program")
    await page.reload()
    await wait_live(page)
    # The alternate screen as the program left it (a torn tail would show the normal screen's last lines).
    await wait_for_text(page, r"header of the program")
    text = await screen_text(page)
    assert "done-16" not in text.split("header of the program")[-1]
    await expect(gap).to_be_visible()
    said = await page.locator("#terminal-gap-text").text_content()
    assert re.fullmatch(r"Reconnected: the screen is as it is now; \d+ KB of earlier output are not kept", said)
    await page.keyboard.press("Control+C")  # the program ends; leaving the alternate screen shows what was before
    await run(page, r"printf '\033[?1049l'")
    await wait_for_text(page, r"^done-16$")

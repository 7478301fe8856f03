"""Where no session holder keeps a shell (TETHER_HOLDER=0 here; a read-only container elsewhere), the page says
that it will not outlive a restart of Tether's worker (the admin's column: test_admin_sessions.py)."""

from __future__ import annotations

import pytest
from playwright.async_api import expect

from tests.browser.test_terminal_page import log_in, open_workspace

pytestmark = [pytest.mark.browser, pytest.mark.django_db, pytest.mark.asyncio(loop_scope="module")]

STACK_ENV = {"TETHER_HOLDER": "0"}


async def test_the_page_says_a_plain_shell_ends_with_its_worker(page, host_machine):
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    badge = page.locator("#terminal-durability")
    await expect(badge).to_be_visible()
    await expect(badge).to_have_text("Ends if Tether restarts")
    why = "no session holder runs on its host (TETHER_HOLDER is off, or it is not built)"
    await expect(badge).to_have_attribute("title", f"This shell ends if Tether's worker restarts: {why}")

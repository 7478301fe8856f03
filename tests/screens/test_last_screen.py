"""A closed shell's last screen, as its page showed it (issue 44, point 5): rendered by the page's own emulator for
every backend when the shell ends, shown in the admin (its list and its page) and the API, said to be drawn from
the output kept when the bytes it was drawn from are no longer all there, hidden when dismissed and removed by the
retention cleanup with the rest of the screen."""

from __future__ import annotations

import asyncio
import contextlib
import html
import re
import uuid

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.test import Client
from websockets.exceptions import ConnectionClosed

from api.terminals import last_screen_out
from api.tokens import create_token
from executions.actions import Actor
from terminals.actions import operator_session_action
from terminals.actions.retention import expire_closed_sessions
from terminals.actions.sessions import close_session
from terminals.models import TerminalSession
from terminals.screen import LastScreen
from tests.bridge.harness import Stack, Viewer, open_viewer

pytestmark = pytest.mark.django_db(transaction=True)

# Drawn by cursor position over a cleared screen: the bytes, stripped of their sequences, are one line with the
# typed command in it; the screen has the word on its third row, four cells in.
DRAW = "printf '\\033[2J\\033[H'; printf '\\033[3;5Hdrawn-%s\\033[10;1H' $((6*7)); exit\r"

# A header drawn once, then rows 3-22 painted over and over (about 300 KB, past a 128 KiB buffer): as top does.
REPAINT = (
    "printf '\\033[2J\\033[1;1Hthe header, drawn once'; i=1; while [ $i -le 14000 ]; do "
    "printf '\\033[%s;1H row %s\\033[K' $((i % 20 + 3)) $i; i=$((i+1)); done; printf '\\033[23;1H'; exit\r"
)


async def closed(viewer: Viewer, session_id: uuid.UUID, timeout: float = 30) -> TerminalSession:
    """Once the shell has ended, its session; its page reads (and acknowledges) its output meanwhile."""
    async with asyncio.timeout(timeout):
        while True:
            session = await TerminalSession.objects.aget(pk=session_id)
            if session.process_state == "closed":
                return session
            with contextlib.suppress(ConnectionClosed):
                await viewer.read_for(0.1)


def rows(text: str) -> list[str]:
    return text.split("\n")


async def api_screen(stack: Stack, user, session_id) -> dict | None:
    raw = (await sync_to_async(create_token)(user, name="screen", scopes=["terminals"]))[1]
    headers = {"Authorization": f"Bearer {raw}"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.ports[0]}/api/v1", headers=headers) as api:
        answer = await api.get(f"/terminals/{session_id}")
        assert answer.status_code == 200, answer.text
        listed = await api.get("/terminals")
        assert listed.status_code == 200, listed.text
        (same,) = [item for item in listed.json() if item["id"] == str(session_id)]
        assert same["last_screen"] == answer.json()["last_screen"]
        return answer.json()["last_screen"]


@pytest.mark.parametrize("backend", ["local", "tmux", "docker"])
async def test_a_closed_shells_last_screen_is_the_screen_its_page_showed(
    stack, terminal, operator, admin_user, backend
):
    viewer, session, _cookie = await open_viewer(stack, terminal, operator, backend)
    await viewer.read_for(0.5)
    await viewer.type(DRAW)
    session = await closed(viewer, session.id)
    await viewer.close()
    shown = rows(session.last_screen)
    assert shown[:3] == ["", "", "    drawn-42"], session.last_screen
    assert session.last_screen_exact and "printf" not in session.last_screen
    assert await api_screen(stack, operator, session.id) == {"text": session.last_screen, "exact": True}

    admin = Client()
    await sync_to_async(admin.force_login)(admin_user)
    page = (await sync_to_async(admin.get)(f"/admin/terminals/terminalsession/{session.id}/change/")).content.decode()
    shown_there = re.search(r"<pre[^>]*>(.*?)</pre>", page, re.S).group(1)
    assert shown_there.startswith("\n\n    drawn-42") and "printf" not in shown_there, shown_there
    listed = (await sync_to_async(admin.get)("/admin/terminals/terminalsession/")).content.decode()
    assert f'<td class="field-last_screen_line">{html.escape(shown[-1].strip())}</td>' in listed


async def test_a_last_screen_is_drawn_for_the_grid_the_page_had(stack, terminal, operator):
    """The page attached at 40x12 (the shell started at 80x24): the last screen is drawn for each grid from where
    it began, so a 60-character line wraps at 40, and it is exact (every byte was there)."""
    viewer, session, _cookie = await open_viewer(stack, terminal, operator, "local", cols=40, rows=12)
    await viewer.read_for(0.5)
    await viewer.type(DRAW.replace("\\033[10;1H' $((6*7)); exit", "\\033[10;1H%060d' $((6*7)) 0; exit"))
    session = await closed(viewer, session.id)
    await viewer.close()
    shown = rows(session.last_screen)
    assert shown[2] == "    drawn-42" and shown[9] == "0" * 40, session.last_screen
    assert shown[10].startswith("0" * 20) and not shown[10].startswith("0" * 21), session.last_screen
    assert session.last_screen_exact


@pytest.mark.parametrize("kept", [False, True], ids=["screens-off", "screens-on"])
async def test_a_last_screen_past_the_buffer_is_exact_where_the_screen_was_kept_and_says_so_where_not(
    terminal, operator, admin_user, kept
):
    """Screens off: the header drawn 300 KB before the end is no longer kept, and the last screen says it is drawn
    from the output kept. Screens on: the worker's emulator kept the screen, and the header is there."""
    env = {"TETHER_BUFFER_BYTES": "131072", "TETHER_SCREEN_SCROLLBACK": "200" if kept else "0"}
    stack = Stack(extra_env=env)
    try:
        await sync_to_async(stack.start)("local")
        viewer, session, _cookie = await open_viewer(stack, terminal, operator, "local")
        await viewer.read_for(0.5)
        await viewer.type(REPAINT)
        session = await closed(viewer, session.id, timeout=60)
        await viewer.close()
        shown = rows(session.last_screen)
        assert shown[2].startswith(" row ") and len(shown) >= 22, session.last_screen
        assert session.last_screen_exact is kept
        assert (shown[0] == "the header, drawn once") is kept, session.last_screen
        admin = Client()
        await sync_to_async(admin.force_login)(admin_user)
        page = await sync_to_async(admin.get)(f"/admin/terminals/terminalsession/{session.id}/change/")
        assert ("drawn from the output kept" in page.content.decode()) is not kept
    finally:
        await sync_to_async(stack.stop)()


async def test_a_last_screen_is_hidden_when_dismissed_and_goes_with_the_retention_cleanup(
    stack, terminal, operator, admin_user
):
    viewer, session, _cookie = await open_viewer(stack, terminal, operator, "local")
    await viewer.read_for(0.5)
    await viewer.type(DRAW)
    session = await closed(viewer, session.id)
    await viewer.close()
    assert "drawn-42" in session.last_screen

    actor = Actor.for_user(admin_user)
    await sync_to_async(operator_session_action)(session, "dismiss", actor=actor, reason="seen")
    assert await api_screen(stack, operator, session.id) is None

    await sync_to_async(expire_closed_sessions)(actor=actor, hours=0)
    session = await TerminalSession.objects.aget(pk=session.id)
    assert session.expired_at and session.last_screen == "" and session.snapshot == b""


def test_a_shell_closed_without_a_last_screen_shows_none_of_an_earlier_shells(terminal, operator):
    """A reset keeps the session: the next shell closed with no screen rendered (no emulator, a spawn failure,
    recovery) shows none, not the last shell's as its own."""
    session, _cookie = terminal(operator, "local")
    actor = Actor.for_user(operator)
    assert close_session(session, reason="exited", actor=actor, screen=LastScreen("the first shell's", exact=True))
    session.refresh_from_db()
    assert (session.last_screen, session.last_screen_exact) == ("the first shell's", True)
    # The next generation, as start_next_generation leaves the session's row (its shell not started here).
    TerminalSession.objects.filter(pk=session.pk).update(
        generation=2, process_state="live", snapshot_kind="live", close_reason="", closed_at=None
    )
    session.refresh_from_db()
    assert close_session(session, reason="exited", actor=actor)
    session.refresh_from_db()
    assert (session.generation, session.last_screen, session.last_screen_exact) == (2, "", False)
    assert last_screen_out(session) is None

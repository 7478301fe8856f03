"""Killing sessions that were streaming to viewers that went away."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from executions.actions import Actor
from executions.models import Evidence, Execution, State
from terminals.actions import open_terminal, operator_session_action
from tests.bridge.harness import STREAM_1MBS, Viewer, session_cookie

pytestmark = [pytest.mark.bridge, pytest.mark.django_db(transaction=True)]


async def test_killing_streaming_sessions_whose_viewers_left_ends_every_one(stack, place, operator, settings):
    settings.TETHER_SESSIONS_PER_USER = 10
    sessions = [
        await sync_to_async(
            lambda n=n: open_terminal(place("local", f"stream-{n}"), operator, shell=list(STREAM_1MBS))[0]
        )()
        for n in range(10)
    ]
    cookie = await sync_to_async(session_cookie)(operator)
    viewers = []
    for session in sessions:
        viewer = await Viewer.open(stack.ports[0], session.id, cookie)
        await viewer.attach()
        viewers.append(viewer)
    for viewer in viewers:
        await viewer.read_until(b"x" * 1000)
    for viewer in viewers:
        await viewer.close()

    def kill(session):
        from terminals.models import TerminalSession

        operator_session_action(TerminalSession.objects.get(pk=session.pk), "kill", actor=Actor.command("test"))

    for session in sessions:
        await sync_to_async(kill)(session)
    # Their viewers left with output unacknowledged, inside the reconnect grace period, so each session's
    # window is shut: the Kill must read on to the end anyway (it once waited for acks that never came).
    ids = [s.execution_id for s in sessions]

    def outcomes():
        return sorted(Execution.objects.filter(pk__in=ids).values_list("state", "evidence"))

    ended = [(State.COMPLETED, Evidence.KILLED)] * len(ids)
    for _ in range(300):
        if await sync_to_async(outcomes)() == ended:
            break
        await asyncio.sleep(0.1)
    assert await sync_to_async(outcomes)() == ended

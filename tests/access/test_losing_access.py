"""Losing access ends access at once, against daphne and a real worker: taken out of the team, a user's open
socket closes within a second with its reason, and their long poll answers at once with nothing printed after;
their shell runs on, held by Tether. A revoked token's long poll ends the same way."""

from __future__ import annotations

import asyncio
import base64
import time

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group

from api.tokens import create_token, revoke_token
from executions.models import Execution, State
from terminals import actions
from tests.bridge.harness import REDIS_URL, Stack, Viewer, session_cookie
from tests.continuity.test_repeated_delivery import layer_config
from tests.factories import grant

pytestmark = [pytest.mark.bridge, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(settings):
    """Daphne and a worker; this process speaks on their channel layer (a grant change here tells them), and
    their sockets' own periodic checks are too slow to be what closes them."""
    stack = Stack()
    stack.extra_env["TETHER_VIEWER_CHECK_SECONDS"] = "60"
    try:
        stack.start("docker")
        settings.CHANNEL_LAYERS = {"default": layer_config(stack, REDIS_URL)}
        yield stack
    finally:
        stack.stop()


async def test_out_of_the_team_closes_the_socket_and_the_long_poll_at_once_and_the_shell_runs_on(stack, place, alice):
    machine = await sync_to_async(place)("docker")
    team = await sync_to_async(Group.objects.create)(name="payments")
    await sync_to_async(team.user_set.add)(alice)
    await sync_to_async(grant)(team, machine, "use")
    session, _ = await sync_to_async(actions.open_terminal)(machine, alice)
    viewer = await Viewer.open(stack.ports[0], session.id, await sync_to_async(session_cookie)(alice))
    await viewer.attach()
    await viewer.type("echo READY-$((3*3))\r")
    await viewer.read_until(b"READY-9")
    _, raw = await sync_to_async(create_token)(alice, name="agent", scopes=["terminals"])
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{stack.ports[0]}/api/v1", headers={"Authorization": f"Bearer {raw}"}, timeout=60
    ) as api:
        # Typed (and echoed) first: the poll waits for what it prints after the removal below. (Typed after the
        # poll began, its echo could answer the poll before the removal: delivered, rightly, while allowed.)
        await viewer.type("sleep 3; echo AFTER-$((4*4))\r")
        await viewer.read_until(b"AFTER-$((4*4))")
        now = (await api.get(f"/terminals/{session.id}/output", params={"since": 0})).json()["end"]
        poll = asyncio.create_task(api.get(f"/terminals/{session.id}/output", params={"since": now, "wait": 30}))
        await asyncio.sleep(0.5)  # the poll waits for output

        removed = time.monotonic()
        await sync_to_async(team.user_set.remove)(alice)
        assert await viewer.wait_closed(timeout=5) == 4015
        closed_after = time.monotonic() - removed
        said = [message for message in viewer.messages if message["type"] == "closed"][-1]
        assert said["reason"] == "not_allowed" and "no longer" in said["text"]
        answer = await asyncio.wait_for(poll, 5)
        polled_after = time.monotonic() - removed
        assert answer.status_code == 404, answer.text  # the shell no longer exists for her
        assert b"AFTER" not in base64.b64decode(answer.json().get("data", "") or "")
        assert closed_after < 1.0 and polled_after < 1.0, (closed_after, polled_after)
        assert (await api.get(f"/terminals/{session.id}")).status_code == 404  # and her next call

    # The shell is still held (operators keep or end it).
    await asyncio.sleep(1)
    execution = await sync_to_async(Execution.objects.get)(pk=session.execution_id)
    assert execution.state == State.RUNNING


async def test_a_revoked_tokens_long_poll_answers_at_once(stack, place, alice):
    machine = await sync_to_async(place)("docker")
    await sync_to_async(grant)(alice, machine, "use")
    token, raw = await sync_to_async(create_token)(alice, name="agent", scopes=["read", "run"])
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{stack.ports[0]}/api/v1", headers={"Authorization": f"Bearer {raw}"}, timeout=60
    ) as api:
        spec = {"scope": "ci", "id": "long", "machine": machine.name, "argv": ["sh", "-c", "sleep 3; echo done"]}
        pk = (await api.post("/executions", json=spec)).json()["execution"]["id"]
        waited = asyncio.create_task(api.get(f"/executions/{pk}/await", params={"timeout": 30}))
        read = asyncio.create_task(api.get(f"/executions/{pk}/output", params={"since": 0, "wait": 30}))
        await asyncio.sleep(1)
        revoked = time.monotonic()
        await sync_to_async(revoke_token)(token.pk, by=alice, reason="leaked")
        answers = await asyncio.wait_for(asyncio.gather(waited, read), 5)
        assert time.monotonic() - revoked < 1.0
        assert [answer.json()["code"] for answer in answers] == ["token_revoked", "token_revoked"]


async def test_a_label_taken_off_the_machine_closes_the_sockets_its_grant_allowed(stack, place, alice):
    """The sockets once kept the machine as it was when they opened: with its label gone, alice typed on."""
    from executions.actions import Actor, set_labels

    machine = await sync_to_async(place)("docker")
    await sync_to_async(set_labels)(machine, {"team": "payments"}, actor=Actor.command("tests"))
    await sync_to_async(grant)(alice, "team=payments", "use")
    session, _ = await sync_to_async(actions.open_terminal)(machine, alice)
    viewer = await Viewer.open(stack.ports[0], session.id, await sync_to_async(session_cookie)(alice))
    await viewer.attach()
    await viewer.type("echo READY-$((3*3))\r")
    await viewer.read_until(b"READY-9")
    changed = time.monotonic()
    await sync_to_async(set_labels)(machine, {"team": "other"}, actor=Actor.command("tests"))
    assert await viewer.wait_closed(timeout=5) == 4015
    assert time.monotonic() - changed < 1.0

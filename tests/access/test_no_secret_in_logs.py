"""No secret reaches a log: a share link's token (it is in the link's path), an API token, a holder's secret and a
password, each used the way people and agents use them (pages, sockets, casts, wrong ones too), then searched
for in every log the servers wrote, daphne's access log included."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from asgiref.sync import sync_to_async
from websockets.asyncio.client import connect

from api.tokens import create_token
from recordings import actions as recording_actions
from terminals import actions
from terminals.models import ProcessLease
from tests.bridge.harness import Stack, Viewer, session_cookie
from tests.factories import grant

pytestmark = [pytest.mark.bridge, pytest.mark.django_db(transaction=True)]


async def test_no_secret_made_here_appears_in_any_log(place, alice, bob):
    stack = Stack()
    try:
        await sync_to_async(stack.start)("docker")
        machine = await sync_to_async(place)("docker")
        await sync_to_async(grant)(alice, machine, "use")
        session, _ = await sync_to_async(actions.open_terminal)(machine, alice)
        viewer = await Viewer.open(stack.ports[0], session.id, await sync_to_async(session_cookie)(alice))
        await viewer.attach()
        await viewer.type("echo UP-$((1+1))\r")
        await viewer.read_until(b"UP-2")
        _, share = await sync_to_async(recording_actions.create_share_link)(alice, session)
        _, token = await sync_to_async(create_token)(alice, name="agent", scopes=["read", "run", "terminals"])
        lease = await sync_to_async(ProcessLease.objects.get)(execution_id=session.execution_id)
        holder_secret = lease.handle.holder.secret
        base = f"http://127.0.0.1:{stack.ports[0]}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as web:
            # A password sign-in, right and wrong.
            login = await web.get("/accounts/login/")
            csrf = web.cookies["csrftoken"]
            for password in ("alice-password", "not-her-password-x9"):
                form = {"username": "alice", "password": password, "csrfmiddlewaretoken": csrf}
                await web.post("/accounts/login/", data=form, headers={"Referer": base})
            assert login.status_code == 200
            # The share link: its page and cast, by someone else signed in; a made-up one; its socket.
            bobs = {"sessionid": await sync_to_async(session_cookie)(bob)}
            assert (await web.get(f"/shares/{share}/", cookies=bobs)).status_code == 200
            await web.get(f"/shares/{share}/cast", cookies=bobs)
            await web.get(f"/shares/{share[:-4]}zzzz/", cookies=bobs)
            shown = {"Cookie": f"sessionid={bobs['sessionid']}", "Origin": base}
            socket = await connect(f"ws://127.0.0.1:{stack.ports[0]}/ws/shares/{share}/", additional_headers=shown)
            await socket.close()
            # The API token, used, and a wrong one.
            headers = {"Authorization": f"Bearer {token}"}
            assert (await web.get("/api/v1/machines", headers=headers)).status_code == 200
            await web.get("/api/v1/machines", headers={"Authorization": f"Bearer {token[:-3]}abc"})
            await web.get(f"/api/v1/machines?token={token}")
        await viewer.close()
        await asyncio.sleep(0.5)
    finally:
        await sync_to_async(stack.stop)()
    logs = {path.name: path.read_text(errors="replace") for path in stack.log_dir.glob(f"{stack.prefix}-*.log")}
    assert any("WSCONNECTING /ws/shares/" in text for text in logs.values())  # the access log is there
    for name, secret in [("share link", share), ("API token", token), ("holder secret", holder_secret),
                         ("password", "alice-password"), ("wrong password", "not-her-password-x9")]:  # fmt: skip
        found = [log for log, text in logs.items() if secret in text]
        assert not found, f"the {name} is in {found}"

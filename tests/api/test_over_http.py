"""The API over real HTTP, against daphne and a real owner worker: what an agent relies on."""

from __future__ import annotations

import asyncio
import base64
import re

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.db import transaction
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from api.tokens import create_token, revoke_token
from executions.actions import Actor, transition
from executions.models import Evidence, ExecutionEvent, State
from tests.bridge.harness import Stack, Viewer
from tests.factories import make_execution

pytestmark = [pytest.mark.bridge, pytest.mark.django_db(transaction=True)]


def bearer(raw: str) -> dict:
    return {"Authorization": f"Bearer {raw}"}


async def new_token(user, *scopes, name="agent") -> str:
    return (await sync_to_async(create_token)(user, name=name, scopes=list(scopes)))[1]


async def test_a_hundred_concurrent_retries_of_one_submit_make_one_execution_and_one_launch(
    stack, place, operator, tmp_path
):
    machine = await sync_to_async(place)("local")
    raw = await new_token(operator, "read", "run")
    launches = tmp_path / "launches"
    spec = {"scope": "agent-7", "id": "task-42", "machine": machine.name}
    spec["argv"] = ["sh", "-c", f"echo launched >> {launches}; printf 'it ran\\n'; exit 3"]
    limits = httpx.Limits(max_connections=100)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.ports[0]}/api/v1", headers=bearer(raw),
                                 limits=limits, timeout=60) as api:  # fmt: skip
        answers = await asyncio.gather(*(api.post("/executions", json=spec) for _ in range(100)))
        statuses = sorted(answer.status_code for answer in answers)
        assert statuses == [200] * 99 + [201]
        ids = {answer.json()["execution"]["id"] for answer in answers}
        assert len(ids) == 1
        pk = ids.pop()
        assert sum(answer.json()["created"] for answer in answers) == 1

        done = (await api.get(f"/executions/{pk}/await", params={"timeout": 30})).json()
        assert done["final"] is True and done["awaiting"] == "nothing"
        assert (done["execution"]["state"], done["execution"]["exit_code"]) == ("completed", 3)
        assert done["execution"]["outcome"] == "Exited with code 3"
        assert launches.read_text() == "launched\n"  # one launch, not a hundred

        output = (await api.get(f"/executions/{pk}/output")).json()
        assert output["source"] == "record" and output["final"] is True
        assert base64.b64decode(output["data"]) == b"it ran\r\n" and output["next"] == output["end"] == 8
        tail = (await api.get(f"/executions/{pk}/output", params={"since": 3})).json()
        assert (tail["offset"], tail["text"], tail["lost"]) == (3, "ran\r\n", 0)

        # An unknown outcome is never final: the await says it waits for an operator.
        other = await sync_to_async(place)("docker", "held-box")

        @transaction.atomic  # committed as unknown: the stack's worker never sees it pending (and dispatches it)
        def unknown():
            execution = make_execution(other, scope="agent-7", execution_id="lost", actor=Actor.for_user(operator))
            execution = transition(execution, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=Actor.command("t"))
            return transition(execution, State.UNKNOWN, evidence=Evidence.CONTROLLER_LOST, actor=Actor.command("t"))

        lost = await sync_to_async(unknown)()
        waited = (await api.get(f"/executions/{lost.pk}/await", params={"timeout": 1})).json()
        assert waited["final"] is False and waited["awaiting"] == "operator"
        assert "until an operator resolves it" in waited["detail"]
        assert waited["execution"]["state"] == "unknown" and waited["execution"]["exit_code"] is None

    dispatches = ExecutionEvent.objects.filter(execution_id=pk, to_state=State.DISPATCHED)
    assert await sync_to_async(dispatches.count)() == 1


async def read_all(api: httpx.AsyncClient, path: str, on_progress) -> tuple[bytes, list[str]]:
    """Read an output by cursor to its end, as an agent would: every answer must start where the last one
    ended (no gap, no duplicate); a 503 is waited out and the same offset asked again."""
    since, collected, events = 0, bytearray(), []
    while True:
        answer = await api.get(path, params={"since": since, "wait": 2})
        if answer.status_code == 503:
            events.append("503")
            assert answer.json()["code"] == "owner_unavailable"
            await asyncio.sleep(int(answer.headers["Retry-After"]))
            continue
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["offset"] == since and body["lost"] == 0, body  # never a silent gap
        collected += base64.b64decode(body["data"])
        since = body["next"]
        await on_progress(bytes(collected))
        if body["final"]:
            return bytes(collected), events


async def test_output_read_by_cursor_across_a_worker_kill_has_no_gap_and_no_duplicate(place, operator):
    stack = Stack()
    stack.extra_env["TETHER_RECOVERY_SECONDS"] = "1"
    try:
        await sync_to_async(stack.start)("docker")
        machine = await sync_to_async(place)("docker")
        raw = await new_token(operator, "read", "run")
        argv = ["sh", "-c", "i=0; while [ $i -lt 300 ]; do echo line-$i; i=$((i+1)); sleep 0.03; done; exit 5"]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.ports[0]}/api/v1", headers=bearer(raw),
                                     timeout=60) as api:  # fmt: skip
            submitted = await api.post("/executions", json={"scope": "s", "id": "stream", "machine": machine.name,
                                                            "argv": argv})  # fmt: skip
            pk = submitted.json()["execution"]["id"]
            killed = asyncio.Event()

            async def kill_midway(collected: bytes) -> None:
                if not killed.is_set() and b"line-60\r\n" in collected:
                    killed.set()
                    first = stack.workers[0]
                    first.kill()
                    await sync_to_async(first.wait)()
                    await sync_to_async(stack.start_worker)("docker")

            collected, _ = await read_all(api, f"/executions/{pk}/output", kill_midway)
            assert killed.is_set()
            assert collected == b"".join(b"line-%d\r\n" % i for i in range(300))  # each line once, in order
            final = (await api.get(f"/executions/{pk}/await", params={"timeout": 30})).json()["execution"]
            assert (final["state"], final["exit_code"]) == ("completed", 5)  # its own exit, read after adoption
    finally:
        await sync_to_async(stack.stop)()


async def test_a_terminal_over_http_and_over_the_socket_with_a_token(stack, place, operator, alice):
    machine = await sync_to_async(place)("local")
    raw = await new_token(operator, "terminals")
    base = f"http://127.0.0.1:{stack.ports[0]}/api/v1"
    async with httpx.AsyncClient(base_url=base, headers=bearer(raw), timeout=60) as api:
        opened = await api.post("/terminals", json={"machine": machine.name})
        assert opened.status_code == 201 and opened.json()["created"] is True
        session = opened.json()["terminal"]
        sid = session["id"]
        again = await api.post("/terminals", json={"machine": machine.name})
        assert again.status_code == 200 and again.json()["terminal"]["id"] == sid  # reattached

        async def read_until(pattern: bytes, since: int = 0) -> tuple[bytes, int]:
            seen = b""
            for _ in range(30):
                answer = await api.get(f"/terminals/{sid}/output", params={"since": since, "wait": 1})
                if answer.status_code == 503:
                    await asyncio.sleep(0.5)
                    continue
                body = answer.json()
                seen += base64.b64decode(body["data"])
                since = body["next"]
                if re.search(pattern, seen):
                    return seen, since
            raise AssertionError(f"{pattern!r} not seen in {seen[-300:]!r}")

        async def type_in(seq: int, data: str) -> dict:
            """Send keys as an agent does: a 503 (the shell still starting) is retried under the same number."""
            for _ in range(100):
                answer = await api.post(f"/terminals/{sid}/input", json={"seq": seq, "data": data})
                if answer.status_code != 503:
                    return answer.json()
                assert answer.json()["code"] == "owner_unavailable" and answer.headers["Retry-After"] == "1"
                await asyncio.sleep(0.2)
            raise AssertionError("the shell never started")

        assert (await type_in(1, "stty -echo; echo ready-$((6*7))\n"))["written"]
        _, since = await read_until(rb"ready-42")
        # A retry of the same number is written once, whatever is sent with it.
        first = await api.post(f"/terminals/{sid}/input", json={"seq": 2, "data": "echo once-$((1+1))\n"})
        retry = await api.post(f"/terminals/{sid}/input", json={"seq": 2, "data": "echo once-$((1+1))\n"})
        assert first.json() == {"written": True, "repeated": False, "seq": 2}
        assert retry.json() == {"written": True, "repeated": True, "seq": 2}
        keys = {"seq": 3, "data_b64": base64.b64encode(b"echo end\n").decode()}
        assert (await api.post(f"/terminals/{sid}/input", json=keys)).json()["written"]
        seen, since = await read_until(rb"end\r\n", since)
        assert seen.count(b"once-2") == 1

        resized = await api.post(f"/terminals/{sid}/resize", json={"cols": 100, "rows": 30})
        assert resized.status_code == 200
        assert (await type_in(4, "stty size\n"))["written"]
        await read_until(rb"30 100", since)
        bad = await api.post(f"/terminals/{sid}/resize", json={"cols": 0, "rows": 30})
        assert bad.status_code == 422

        state = (await api.get(f"/terminals/{sid}")).json()
        assert state["process_state"] == "live" and state["snapshot_kind"] == "live" and state["close_reason"] == ""

        # The browser's protocol with the token instead of a cookie (no Origin: not a page).
        ws_url = f"ws://127.0.0.1:{stack.ports[0]}/ws/terminals/{sid}/"
        viewer = Viewer(await connect(ws_url, additional_headers=bearer(raw), ping_interval=None))
        await viewer.attach()
        await viewer.type("echo via-socket-$((2*3))\n")
        await viewer.read_until(b"via-socket-6")
        # While that window writes, API keys are still the same person's: they go in.
        assert (await api.post(f"/terminals/{sid}/input", json={"seq": 5, "data": "echo x\n"})).json()["written"]
        assert (await api.post(f"/terminals/{sid}/resize", json={"cols": 90, "rows": 30})).json()[
            "code"
        ] == "not_writer"

        # Another user's token reaches nothing of it; a token without the scope reaches nothing at all.
        other = await new_token(alice, "terminals", "read", name="alice")
        assert (await api.get(f"/terminals/{sid}", headers=bearer(other))).status_code == 404
        with pytest.raises(InvalidStatus):
            await connect(ws_url, additional_headers=bearer(other))
        reader = await new_token(operator, "read", name="reader")
        assert (await api.get(f"/terminals/{sid}", headers=bearer(reader))).json()["code"] == "insufficient_scope"
        with pytest.raises(InvalidStatus):
            await connect(ws_url, additional_headers=bearer(reader))
        with pytest.raises(InvalidStatus):  # no token, no Origin
            await connect(ws_url)

        # Revoked: the open socket is closed at once, and every call is refused.
        token = await sync_to_async(lambda: operator.api_tokens.get(name="agent"))()
        await sync_to_async(revoke_token)(token.pk, by=operator, reason="test")
        assert await viewer.wait_closed() == 4015
        assert (await api.get(f"/terminals/{sid}")).json()["code"] == "token_revoked"
        with pytest.raises(InvalidStatus):
            await connect(ws_url, additional_headers=bearer(raw))

        fresh = await new_token(operator, "terminals", name="second")
        closed = await api.post(f"/terminals/{sid}/close", json={"reason": "done"}, headers=bearer(fresh))
        assert closed.status_code == 202
        for _ in range(100):
            state = (await api.get(f"/terminals/{sid}", headers=bearer(fresh))).json()
            if state["process_state"] == "closed":
                break
            await asyncio.sleep(0.1)
        assert state["process_state"] == "closed" and state["snapshot_kind"] == "archived"
        assert state["close_reason"] == "completed"
        refused = await api.post(f"/terminals/{sid}/input", json={"seq": 9, "data": "x"}, headers=bearer(fresh))
        assert refused.json()["code"] == "state_conflict"

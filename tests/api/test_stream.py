"""An execution's output as Server-Sent Events (issue 42, point 10), against daphne, a real worker and Debian's
HAProxy: resumable by Last-Event-ID, across a worker kill, with the long poll's honesty (`lost`, an `end` that
says `unknown` and what it awaits), and ended at once when the token is revoked."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.db import transaction

from api.tokens import create_token, revoke_token
from executions.actions import Actor, transition
from executions.models import Evidence, State
from tests.bridge.harness import Stack
from tests.factories import make_execution
from tests.hosts.harness import Balancer

pytestmark = [pytest.mark.bridge, pytest.mark.django_db(transaction=True)]


def client(port: int, raw: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}/api/v1", headers={"Authorization": f"Bearer {raw}"}, timeout=60
    )


async def events(response: httpx.Response):
    """The events of an SSE answer as (event, id, data), comments left out."""
    kind, said_id, data = "message", None, []
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield kind, said_id, json.loads("\n".join(data))
            kind, said_id, data = "message", None, []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                kind = value
            elif field == "id":
                said_id = value
            elif field == "data":
                data.append(value)


async def test_the_stream_goes_on_by_last_event_id_through_haproxy_across_a_worker_kill(place, operator):
    stack = Stack()
    stack.extra_env |= {"TETHER_RECOVERY_SECONDS": "1"}
    balancer = None
    try:
        await sync_to_async(stack.start)("local")
        balancer = await sync_to_async(Balancer({"web": stack.ports[0]}).start)()
        machine = await sync_to_async(place)("local")
        raw = (await sync_to_async(create_token)(operator, name="sse", scopes=["read", "run"]))[1]
        async with client(balancer.port, raw) as api:
            spec = {"scope": "sse", "id": "through", "machine": machine.name}
            spec["argv"] = ["sh", "-c", "sleep 1; seq 1 400000; sleep 1; echo END"]
            pk = (await api.post("/executions", json=spec)).json()["execution"]["id"]
            seen, last_id, kinds = bytearray(), None, []
            # First connection: read about 600 KB, then the client goes away and the worker is killed.
            async with api.stream("GET", f"/executions/{pk}/output/stream") as response:
                assert response.status_code == 200, await response.aread()
                assert response.headers["content-type"].startswith("text/event-stream")
                async for kind, said_id, data in events(response):
                    kinds.append(kind)
                    assert kind == "output", (kind, data)
                    assert data["offset"] == len(seen) and data["lost"] == 0, data
                    seen += base64.b64decode(data["data"])
                    last_id = said_id
                    if len(seen) > 600_000:
                        break
            assert int(last_id) == len(seen)
            first = stack.workers[0]
            first.kill()
            await sync_to_async(first.wait)()
            # Second connection, as an EventSource reconnects: from Last-Event-ID, while no worker holds the
            # process; a new one is started once the stream has said it waits.
            end = None
            headers = {"Last-Event-ID": last_id}
            async with api.stream("GET", f"/executions/{pk}/output/stream", headers=headers) as response:
                assert response.status_code == 200
                async for kind, said_id, data in events(response):
                    kinds.append(kind)
                    if kind == "waiting":
                        assert data["since"] == len(seen), data
                        await sync_to_async(stack.start_worker)("local")
                        continue
                    if kind == "end":
                        end = data
                        break
                    assert kind == "output" and data["offset"] == len(seen) and data["lost"] == 0, data
                    seen += base64.b64decode(data["data"])
                    assert int(said_id) == len(seen)
            assert "waiting" in kinds  # it said so while no worker held the process
            assert end["execution"]["state"] == "completed" and end["execution"]["exit_code"] == 0, end
            assert (end["awaiting"], end["complete"]) == ("nothing", True)
            lines = bytes(seen).split(b"\r\n")
            assert [int(line) for line in lines if line.isdigit()] == list(range(1, 400_001))  # each once, in order
            assert lines[-2:] == [b"END", b""]
    finally:
        if balancer is not None:
            await sync_to_async(balancer.stop)()
        await sync_to_async(stack.stop)()


async def test_a_revoked_token_ends_the_stream_at_once_and_bad_starts_are_problems(stack, place, operator, bob):
    machine = await sync_to_async(place)("local")
    token, raw = await sync_to_async(create_token)(operator, name="sse", scopes=["read", "run"])
    async with client(stack.ports[0], raw) as api:
        spec = {"scope": "sse", "id": "revoked", "machine": machine.name, "argv": ["sh", "-c", "echo hi; sleep 60"]}
        pk = (await api.post("/executions", json=spec)).json()["execution"]["id"]
        for headers, params, status, code in (
            ({"Last-Event-ID": "abc"}, {}, 400, "invalid_request"),
            ({"Last-Event-ID": "-1"}, {}, 400, "invalid_request"),
            ({}, {"since": 10_000_000}, 416, "offset_out_of_range"),
            ({}, {"sinse": 0}, 400, "unknown_fields"),
        ):
            refused = await api.get(f"/executions/{pk}/output/stream", headers=headers, params=params)
            assert refused.status_code == status and refused.json()["code"] == code, refused.text
            assert refused.headers["content-type"] == "application/problem+json"
        async with api.stream("GET", f"/executions/{pk}/output/stream") as response:
            seen = []
            async for kind, _, data in events(response):
                seen.append((kind, data))
                if kind == "output" and b"hi" in base64.b64decode(data["data"]):
                    revoked_at = asyncio.get_running_loop().time()
                    await sync_to_async(revoke_token)(token.pk, by=operator)
            took = asyncio.get_running_loop().time() - revoked_at
        assert seen[-1] == ("error", {"code": "token_revoked", "detail": seen[-1][1]["detail"]}), seen
        assert took < 3, took  # the stream ended with the revoke, not at the command's end or the stream's time
    # Another person's execution is as one that is not there.
    other = (await sync_to_async(create_token)(bob, name="sse", scopes=["read"]))[1]
    async with client(stack.ports[0], other) as api:
        assert (await api.get(f"/executions/{pk}/output/stream")).status_code == 404


async def test_an_unknown_outcome_ends_the_stream_saying_it_awaits_an_operator(stack, place, operator):
    machine = await sync_to_async(place)("local", "unknown-box")

    @transaction.atomic  # committed as unknown: the stack's worker never sees it pending (and dispatches it)
    def unknown():
        execution = make_execution(machine, actor=Actor.for_user(operator))
        execution.requested_by = operator
        execution.save(update_fields=["requested_by"])
        for state, evidence in ((State.DISPATCHED, Evidence.CLAIMED), (State.UNKNOWN, Evidence.CONTROLLER_LOST)):
            execution = transition(execution, state, evidence=evidence, actor=Actor("test"))
        return execution.pk

    pk = await sync_to_async(unknown)()
    raw = (await sync_to_async(create_token)(operator, name="sse", scopes=["read"]))[1]
    async with client(stack.ports[0], raw) as api, api.stream("GET", f"/executions/{pk}/output/stream") as response:
        said = [(kind, data) async for kind, _, data in events(response)]
    assert [kind for kind, _ in said] == ["end"], said
    end = said[0][1]
    assert (end["execution"]["state"], end["execution"]["exit_code"], end["awaiting"]) == ("unknown", None, "operator")
    assert "until an operator resolves it" in end["detail"]
    # An EventSource reconnects after the end (with the end's id): told there is no more, it stops.
    async with client(stack.ports[0], raw) as api:
        again = await api.get(f"/executions/{pk}/output/stream", headers={"Last-Event-ID": "0"})
        assert (again.status_code, again.content, again.headers.get("content-type")) == (204, b"", None)
        for said in ("²", "1e3", "-0"):  # digits only (a superscript two is a digit to Python: it was a 500)
            headers = {"Last-Event-ID": said.encode("latin-1")}  # as a client may send it, not ASCII
            refused = await api.get(f"/executions/{pk}/output/stream", headers=headers)
            assert (refused.status_code, refused.json()["code"]) == (400, "invalid_request"), (said, refused.text)

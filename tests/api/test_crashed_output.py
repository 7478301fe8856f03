"""A command's output across a SIGKILL of the worker running it: what was seen stays in the record, and what
no worker saw is said, never a silent gap. Before, the record of a crashed command was emptied: local without
the holder `end=0, lost=0` after "started" had been read; docker `exit 5` read back with 0 bytes (3 of 3)."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest
from asgiref.sync import sync_to_async

from api.tokens import create_token
from tests.bridge.harness import Stack

pytestmark = [pytest.mark.bridge, pytest.mark.django_db(transaction=True)]


async def read_until(api: httpx.AsyncClient, pk: int, needle: bytes) -> bytes:
    seen, since = b"", 0
    deadline = asyncio.get_running_loop().time() + 60
    while needle not in seen:
        assert asyncio.get_running_loop().time() < deadline, seen
        read = await api.get(f"/executions/{pk}/output", params={"since": since, "wait": 1})
        if read.status_code == 503:
            continue
        assert read.status_code == 200, read.text
        since, seen = read.json()["next"], seen + base64.b64decode(read.json()["data"])
    return seen


async def settled(api: httpx.AsyncClient, pk: int) -> dict:
    for _ in range(60):
        answer = (await api.get(f"/executions/{pk}/await", params={"timeout": 5})).json()
        if answer["final"] or answer["execution"]["state"] == "unknown":  # unknown waits for an operator
            return answer
    raise AssertionError(f"execution {pk} did not settle: {answer}")


@pytest.mark.parametrize(
    ("backend", "held"),
    [("local", False), ("local", True), ("docker", True)],
    ids=["local-unheld", "local-held", "docker-held"],
)
async def test_a_crashed_commands_output_keeps_what_was_seen_and_says_what_was_not(place, operator, backend, held):
    stack = Stack()
    stack.extra_env |= {"TETHER_RECOVERY_SECONDS": "1"} | ({} if held else {"TETHER_HOLDER": "0"})
    try:
        await sync_to_async(stack.start)(backend)
        machine = await sync_to_async(place)(backend)
        raw = (await sync_to_async(create_token)(operator, name="crash", scopes=["read", "run"]))[1]
        base = f"http://127.0.0.1:{stack.ports[0]}/api/v1"
        async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {raw}"}, timeout=60) as api:
            script = "echo start; sleep 6; echo late; exit 5" if held else "echo start; sleep 300"
            spec = {"scope": "crash", "id": f"{backend}-{held}", "machine": machine.name, "argv": ["sh", "-c", script]}
            pk = (await api.post("/executions", json=spec)).json()["execution"]["id"]
            assert await read_until(api, pk, b"start\r\n") == b"start\r\n"
            await asyncio.sleep(1.5)  # seen by its worker over a second before it dies
            first = stack.workers[0]
            first.kill()
            await sync_to_async(first.wait)()
            if held:
                await asyncio.sleep(6)  # it prints the rest and exits while no worker is there
            await sync_to_async(stack.start_worker)(backend)
            execution = (await settled(api, pk))["execution"]
            output = (await api.get(f"/executions/{pk}/output")).json()
            if held:  # the holder kept the process and what nobody had read: the record joins the two
                assert (execution["state"], execution["exit_code"]) == ("completed", 5), execution
                assert (output["text"], output["lost"]) == ("start\r\nlate\r\n", 0), output  # was ""
                assert output["complete"] is True
            else:  # nobody can see the rest: what was seen stays (it was end=0), the rest is said to be missing
                assert execution["state"] == "unknown", execution
                assert (output["text"], output["end"]) == ("start\r\n", 7), output  # was "", end 0
                assert output["complete"] is False
    finally:
        await sync_to_async(stack.stop)()

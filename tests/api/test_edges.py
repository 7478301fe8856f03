"""The API at its edges, against daphne and a real owner worker: a shell read the moment it is opened, offsets
no output has reached, a working directory the engine refuses."""

from __future__ import annotations

import asyncio
import base64
import re

import httpx
import pytest
from asgiref.sync import sync_to_async

from api.tokens import create_token
from tests.bridge.harness import Stack

pytestmark = [pytest.mark.bridge, pytest.mark.django_db(transaction=True)]


def client(stack, raw: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{stack.ports[0]}/api/v1", headers={"Authorization": f"Bearer {raw}"}, timeout=60
    )


async def token(user, *scopes) -> str:
    return (await sync_to_async(create_token)(user, name="edges", scopes=list(scopes)))[1]


@pytest.mark.parametrize("backend", ["local", "docker"])
async def test_a_shell_read_the_moment_it_is_opened_answers_with_its_output_never_a_500(
    stack, place, operator, backend
):
    machine = await sync_to_async(place)(backend)
    async with client(stack, await token(operator, "terminals")) as api:
        opened = await api.post("/terminals", json={"machine": machine.name})
        assert opened.status_code == 201, opened.text
        session = opened.json()["terminal"]["id"]
        # Before any worker holds it (KeyError 'epoch': an HTML 500 on the first one to three reads).
        reads = [await api.get(f"/terminals/{session}/output", params={"since": 0}) for _ in range(5)]
        assert [read.status_code for read in reads] == [200] * 5, [read.text[:200] for read in reads]
        assert {read.headers["content-type"] for read in reads} == {"application/json; charset=utf-8"}
        assert all(read.json()["lost"] == 0 and read.json()["offset"] == 0 for read in reads)


async def test_an_offset_past_the_end_is_refused_with_where_the_output_ends(stack, place, operator):
    machine = await sync_to_async(place)("local")
    async with client(stack, await token(operator, "read", "run", "terminals")) as api:
        spec = {"scope": "edges", "id": "past-end", "machine": machine.name, "argv": ["printf", "abc"]}
        pk = (await api.post("/executions", json=spec)).json()["execution"]["id"]
        assert (await api.get(f"/executions/{pk}/await", params={"timeout": 30})).json()["final"]
        whole = (await api.get(f"/executions/{pk}/output")).json()
        assert (whole["text"], whole["end"], whole["next"], whole["final"]) == ("abc", 3, 3, True)
        at_end = (await api.get(f"/executions/{pk}/output", params={"since": 3})).json()
        assert (at_end["offset"], at_end["next"], at_end["end"], at_end["data"]) == (3, 3, 3, "")

        past = await api.get(f"/executions/{pk}/output", params={"since": 3 + 5000})
        assert past.status_code == 416 and past.headers["content-type"] == "application/problem+json"
        assert (past.json()["code"], past.json()["end"]) == ("offset_out_of_range", 3)  # was 200 with end 5003
        huge = await api.get(f"/executions/{pk}/output", params={"since": 2**63})
        assert huge.status_code == 422, huge.text  # was 200 with end 9223372036854775808

        # A live shell: past its end is refused too, with its end; at its end, nothing yet.
        shell = await sync_to_async(place)("local", "live-box")
        session = (await api.post("/terminals", json={"machine": shell.name})).json()["terminal"]["id"]
        for _ in range(100):
            read = (await api.get(f"/terminals/{session}/output", params={"since": 0})).json()
            if read["end"] and read["epoch"]:
                break
            await asyncio.sleep(0.1)
        end = read["end"]
        past = await api.get(f"/terminals/{session}/output", params={"since": end + 5000, "epoch": read["epoch"]})
        assert past.status_code == 416, past.text
        assert past.json()["code"] == "offset_out_of_range" and past.json()["end"] >= end

        # Closed: its final tail, with the offsets it had, and past its end refused.
        assert (await api.post(f"/terminals/{session}/close", json={})).status_code == 202
        for _ in range(100):
            if (await api.get(f"/terminals/{session}")).json()["process_state"] == "closed":
                break
            await asyncio.sleep(0.1)
        final = (await api.get(f"/terminals/{session}/output", params={"since": 0})).json()
        assert final["final"] and final["source"] == "record" and final["end"] >= end
        assert final["next"] == final["end"] and final["lost"] == 0 and final["data"]
        past = await api.get(f"/terminals/{session}/output", params={"since": final["end"] + 1})
        assert (past.status_code, past.json()["end"]) == (416, final["end"])


async def test_a_working_directory_the_machine_cannot_have_is_refused_or_ends_never_started(stack, place, operator):
    machine = await sync_to_async(place)("docker")
    async with client(stack, await token(operator, "read", "run")) as api:
        spec = {"scope": "edges", "id": "relative", "machine": machine.name, "argv": ["pwd"], "cwd": "relative/dir"}
        refused = await api.post("/executions", json=spec)
        # Was 201, then unknown/controller_lost once the engine refused it: the machine blocked until resolved.
        assert refused.status_code == 422 and refused.json()["code"] == "validation_error", refused.text
        assert "absolute" in refused.json()["detail"]

        # Absolute, but not in the container: the engine refuses it before anything starts.
        spec |= {"id": "missing", "cwd": "/no/such/dir"}
        pk = (await api.post("/executions", json=spec)).json()["execution"]["id"]
        done = (await api.get(f"/executions/{pk}/await", params={"timeout": 30})).json()
        assert done["final"] and done["execution"]["state"] == "completed", done
        assert done["execution"]["evidence"] in ("spawn_failed", "never_started"), done

        # A program the container does not have: it did not start, and it says why (it said only "Did not start").
        absent = {"scope": "edges", "id": "absent", "machine": machine.name, "argv": ["make", "test"]}
        pk = (await api.post("/executions", json=absent)).json()["execution"]["id"]
        done = (await api.get(f"/executions/{pk}/await", params={"timeout": 30})).json()
        assert done["final"] and done["execution"]["exit_code"] is None, done
        assert "make" in done["execution"]["why"] and done["execution"]["why"] in done["detail"], done
        listed = (await api.get("/executions", params={"scope": "edges"})).json()
        assert next(e for e in listed if e["id"] == pk)["why"] == done["execution"]["why"]

        # The slot is free: the next command runs, and its own exit needs no why.
        spec |= {"id": "after", "cwd": "/tmp"}
        pk = (await api.post("/executions", json=spec)).json()["execution"]["id"]
        done = (await api.get(f"/executions/{pk}/await", params={"timeout": 30})).json()
        assert (done["execution"]["state"], done["execution"]["exit_code"]) == ("completed", 0), done
        assert (done["execution"]["why"], done["detail"]) == ("", "Exited with code 0"), done
        assert (await api.get(f"/executions/{pk}/output")).json()["text"] == "/tmp\r\n"  # a terminal's line end


async def test_a_typed_line_echoes_on_one_row_for_a_client_that_answers_no_cursor_query(stack, place, operator):
    """busybox sh (docker) counted the prompt's invisible marks as columns, so for a client that does not
    answer ESC [6n (an API client, a script) the echo of a typed line broke mid-line with \\r\\r\\n."""
    machine = await sync_to_async(place)("docker")
    async with client(stack, await token(operator, "terminals")) as api:
        session = (await api.post("/terminals", json={"machine": machine.name})).json()["terminal"]["id"]
        since, seen = 0, b""
        for _ in range(150):  # the first prompt (its marks end with the prompt's B mark)
            read = (await api.get(f"/terminals/{session}/output", params={"since": since, "wait": 0.2})).json()
            since, seen = read["next"], seen + base64.b64decode(read["data"])
            if b"\x1b]133;B" in seen:
                break
        line = "echo " + "x" * 60  # with the prompt ("/ # "), well inside 80 columns
        typed = await api.post(f"/terminals/{session}/input", json={"seq": 1, "data": line})
        assert typed.status_code == 200, typed.text
        echoed = b""
        for _ in range(50):
            read = (await api.get(f"/terminals/{session}/output", params={"since": since, "wait": 0.2})).json()
            since, echoed = read["next"], echoed + base64.b64decode(read["data"])
            if echoed.count(b"x") >= 60:
                break
        assert b"x" * 60 in echoed and b"\r\r\n" not in echoed, echoed


@pytest.mark.parametrize("backend", ["local", "docker"])
async def test_input_sent_while_the_worker_is_dead_is_503_and_the_same_seq_is_written_once_later(
    place, operator, backend
):
    """After a SIGKILL of the worker holding a shell, numbered input got 409 input_unconfirmed, and that seq
    (and the next) were never written: retries got 409 too. It was provably never written (nobody took it),
    so it is 503 owner_unavailable, and the same seq is written once a worker holds the shell again."""
    stack = Stack()
    stack.extra_env |= {"TETHER_RECOVERY_SECONDS": "1"}
    try:
        await sync_to_async(stack.start)(backend)
        machine = await sync_to_async(place)(backend)
        async with client(stack, await token(operator, "terminals")) as api:
            session = (await api.post("/terminals", json={"machine": machine.name})).json()["terminal"]["id"]
            for _ in range(100):  # once a worker holds the new shell
                first_keys = await api.post(f"/terminals/{session}/input", json={"seq": 1, "data": "echo up\n"})
                if first_keys.status_code != 503:
                    break
                await asyncio.sleep(0.1)
            assert first_keys.status_code == 200, first_keys.text
            await read_until(api, session, b"up\r\n")
            first = stack.workers[0]
            first.kill()
            await sync_to_async(first.wait)()
            keys = {"seq": 2, "data": "echo seq-$((10+10))\n"}
            refused = await api.post(f"/terminals/{session}/input", json=keys)
            assert refused.status_code == 503 and refused.json()["code"] == "owner_unavailable", refused.text
            await sync_to_async(stack.start_worker)(backend)
            statuses = [refused.status_code]
            for _ in range(60):
                answer = await api.post(f"/terminals/{session}/input", json=keys)
                statuses.append(answer.status_code)
                if answer.status_code == 200:
                    break
                assert answer.status_code == 503, answer.text  # never 409: it was never written
                await asyncio.sleep(0.5)
            assert answer.json() == {"written": True, "repeated": False, "seq": 2}, statuses
            again = await api.post(f"/terminals/{session}/input", json=keys)
            assert again.json() == {"written": True, "repeated": True, "seq": 2}
            output = await read_until(api, session, b"seq-20\r\n")
            assert output.count(b"seq-20\r\n") == 1
    finally:
        await sync_to_async(stack.stop)()


async def read_until(api: httpx.AsyncClient, session: str, needle: bytes, timeout: float = 30) -> bytes:
    """The shell's output from its start until ``needle`` (held shells keep their offsets across owners)."""
    seen, since = b"", 0
    deadline = asyncio.get_running_loop().time() + timeout
    while needle not in seen:
        assert asyncio.get_running_loop().time() < deadline, seen[-500:]
        read = await api.get(f"/terminals/{session}/output", params={"since": since, "wait": 1})
        if read.status_code == 503:
            continue
        since, seen = read.json()["next"], seen + base64.b64decode(read.json()["data"])
    return seen


@pytest.mark.parametrize("backend", ["local", "docker"])
async def test_an_api_reader_loses_nothing_across_a_worker_kill(place, operator, backend):
    """A caught-up reader of a running command's output, its worker SIGKILLed mid-stream: the next owner
    keeps what the reader has not read (it lost 130,176 to 770,176 bytes, 0 clean runs of 10)."""
    stack = Stack()
    stack.extra_env |= {"TETHER_RECOVERY_SECONDS": "1"}
    try:
        await sync_to_async(stack.start)(backend)
        machine = await sync_to_async(place)(backend)
        async with client(stack, await token(operator, "read", "run")) as api:
            spec = {"scope": "edges", "id": f"stream-{backend}", "machine": machine.name}
            spec["argv"] = ["sh", "-c", "sleep 2; seq 1 700000; echo END"]  # the reader is there first
            pk = (await api.post("/executions", json=spec)).json()["execution"]["id"]
            seen, since, killed, losses = bytearray(), 0, False, []
            deadline = asyncio.get_running_loop().time() + 120
            empty, most_empty = 0, 0  # reads in a row that waited their second for nothing
            while b"END\r\n" not in seen[-10:]:
                assert asyncio.get_running_loop().time() < deadline, (len(seen), seen[-200:])
                read = await api.get(f"/executions/{pk}/output", params={"since": since, "wait": 1})
                if read.status_code == 503:
                    continue
                assert read.status_code == 200, read.text
                answer = read.json()
                empty = 0 if answer["data"] else empty + 1
                most_empty = max(most_empty, empty)
                losses.append((answer["lost"], killed, answer["offset"]))
                assert answer["offset"] == since or answer["lost"], answer
                seen += base64.b64decode(answer["data"])
                since = answer["next"]
                if not killed and len(seen) > 1_000_000:
                    first = stack.workers[0]
                    first.kill()
                    await sync_to_async(first.wait)()
                    await sync_to_async(stack.start_worker)(backend)
                    killed = True
            assert killed and [loss for loss in losses if loss[0]] == []
            # The adopter kept the output for the reader to come back, then let it run as it read: the command
            # was held still for the whole reconnect grace (56 empty reads in a row, 60 s) once it was back.
            assert most_empty < 15, most_empty
            numbers = [int(line) for line in bytes(seen).split(b"\r\n") if line.isdigit()]
            assert numbers == list(range(1, 700_001))  # every line once, in order
    finally:
        await sync_to_async(stack.stop)()


async def test_numbered_input_is_written_in_number_order_and_a_reused_number_with_other_keys_is_refused(
    stack, place, operator
):
    """Input 5 after 2, then 4, then 3 ran as 5, 4, 3, and 2 sent again with other keys answered `repeated` and
    dropped them silently. Now a number that skips one is 409 input_gap naming the expected one, and a number sent
    again with other keys is 409 input_conflict; what is written runs in number order."""
    machine = await sync_to_async(place)("local")
    async with client(stack, await token(operator, "terminals")) as api:
        session = (await api.post("/terminals", json={"machine": machine.name})).json()["terminal"]["id"]

        async def send(seq: int, data: str, client_name: str = "") -> httpx.Response:
            for _ in range(100):  # the shell still starting: the same number again
                answer = await api.post(
                    f"/terminals/{session}/input", json={"seq": seq, "data": data, "client": client_name}
                )
                if answer.status_code != 503:
                    return answer
                await asyncio.sleep(0.1)
            raise AssertionError("the shell never started")

        assert (await send(1, "echo n-1\n")).status_code == 200
        assert (await send(2, "echo n-2\n")).json() == {"written": True, "repeated": False, "seq": 2}
        for skipped in (5, 4):
            refused = await send(skipped, f"echo n-{skipped}\n")
            assert refused.status_code == 409 and refused.headers["content-type"] == "application/problem+json"
            assert (refused.json()["code"], refused.json()["expected"]) == ("input_gap", 3), refused.text
        conflict = await send(2, "echo other-keys\n")
        assert conflict.status_code == 409
        assert (conflict.json()["code"], conflict.json()["expected"]) == ("input_conflict", 3)
        assert (await send(2, "echo n-2\n")).json() == {"written": True, "repeated": True, "seq": 2}
        for seq in (3, 4, 5):
            assert (await send(seq, f"echo n-{seq}\n")).json()["written"]
        # Another client of the same token counts on its own, from its own first number.
        assert (await send(100, "echo other-client\n", "second")).json()["written"]
        seen = await read_until(api, session, b"other-client\r\n")
        ran = re.findall(rb"(?<!echo )n-(\d)\r\n", seen)  # what the commands printed, not their echo
        assert ran == [b"1", b"2", b"3", b"4", b"5"], seen[-600:]
        assert b"other-keys" not in seen


async def test_a_20_kb_bearer_token_is_answered_as_a_problem_and_a_malformed_request_line_too(stack):
    """A 20 KB Authorization header dropped the connection (Twisted's 16 KiB line limit, a bare 400 and no body)."""
    # (Raw requests, each read to the server's close within 10 s: once, httpx's client never returned from its close
    # after the first, and the run hung.)
    said = await raw(stack, b"GET /api/v1/machines HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     b"Authorization: Bearer " + b"x" * 20_000 + b"\r\n\r\n")  # fmt: skip
    head, _, body = said.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 401") and b"application/problem+json" in head, said[:300]
    assert b'"code": "unauthenticated"' in body
    said = await raw(stack, b"GET /api/v1/machines HTTP/1.1 trailing-garbage\r\nHost: x\r\n\r\n")
    head, _, body = said.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/problem+json" in head, said[:300]
    assert b'"code": "invalid_request"' in body


async def raw(stack, request: bytes) -> bytes:
    """What daphne answers ``request`` on a connection of its own, read until it closes it (10 s at most)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", stack.ports[0]), 10)
    try:
        writer.write(request)
        await asyncio.wait_for(writer.drain(), 10)
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()

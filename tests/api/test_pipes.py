"""Commands without a terminal (`pty: false`): stdout and stderr kept apart, each readable by its own offset
and both by the order they came, stdin written once per number and closed, the exit as the program's own, on
every backend and across a SIGKILL of the worker holding it."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal

import httpx
import pytest
from asgiref.sync import sync_to_async
from tether_client import Client

from api.tokens import create_token
from executions import pipes
from tests.bridge.harness import Stack
from tests.factories import grant

SCRIPT = "printf out1; printf err1 >&2; test -t 0 || printf ' no-tty' >&2; cat; printf 'done\\n' >&2; exit 3"


def _line(kind: bytes, out: int, err: int, data: bytes) -> bytes:
    return kind + f"{out},{err},{len(data)}:".encode() + base64.b64encode(data) + b"\n"


def test_the_encoded_stream_is_read_from_any_place_in_each_view():
    stream = (
        _line(b"O", 0, 0, b"hello ")
        + _line(b"E", 6, 0, b"oops\n")
        + b"Dechoed-before-raw-mode\r\n"
        + _line(b"O", 0, 0, b"hello ")  # a redraw repeats a line: not a piece again
        + b"O6,5,6:d29y\r\n"  # a line cut short by a redraw
        + _line(b"O", 6, 5, b"world\n")
        + b"O12,5,5:aGVsbG"  # a line not yet ended: left for the next read
    )
    found = pipes.pieces(stream, 0)
    assert [(p.stream, p.out, p.err, p.data) for p in found] == [
        (pipes.View.STDOUT, 0, 0, b"hello "),
        (pipes.View.STDERR, 6, 0, b"oops\n"),
        (pipes.View.STDOUT, 6, 5, b"world\n"),
    ]
    for view, since, data, end in [
        (pipes.View.STDOUT, 0, b"hello world\n", 12),
        (pipes.View.STDOUT, 3, b"lo world\n", 12),
        (pipes.View.STDERR, 1, b"ops\n", 5),
        (pipes.View.ALL, 4, b"o oops\nworld\n", 17),
    ]:
        read = pipes.read(found, view, since, 1000, 0, end)
        assert (read.data, read.offset, read.next, read.lost) == (data, since, since + len(data), 0)
    merged = pipes.read(found, pipes.View.ALL, 0, 1000, 0, 17)
    assert [(c.stream, c.offset, c.seq, c.data) for c in merged.chunks] == [
        (pipes.View.STDOUT, 0, 0, b"hello "),
        (pipes.View.STDERR, 0, 6, b"oops\n"),
        (pipes.View.STDOUT, 6, 11, b"world\n"),
    ]
    assert pipes.read(found, pipes.View.STDOUT, 0, 8, 0, 12).data == b"hello wo"  # bounded by size

    # Kept from the middle of a line on (a buffer trimmed anywhere): the cut line is skipped, never guessed,
    # and what is gone before the first whole line is said, in each view's own offsets.
    cut = stream[5:]
    found = pipes.pieces(cut, 5)
    assert [p.data for p in found] == [b"oops\n", b"world\n"]
    assert pipes.first_and_end(found, pipes.View.STDOUT, whole=False) == (6, 12)
    read = pipes.read(found, pipes.View.STDOUT, 0, 1000, 6, 12)
    assert (read.data, read.offset, read.lost) == (b"world\n", 6, 6)

    assert pipes.encode_input(b"x" * 1000, close=True).count(b"\n") == 3  # 768 + 232 bytes, then the end


def _api(stack: Stack, user, *scopes: str) -> httpx.AsyncClient:
    raw = create_token(user, name=f"pipes-{os.urandom(4).hex()}", scopes=list(scopes or ("read", "run")))[1]
    base = f"http://127.0.0.1:{stack.ports[0]}/api/v1"
    return httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {raw}"}, timeout=60)


async def _read(api: httpx.AsyncClient, pk: int, stream: str, since: int = 0, until: bytes = b"") -> tuple[bytes, dict]:
    """A stream of the command from ``since``, read by ``next`` until ``until`` is in it (or its end)."""
    seen, answer = b"", {}
    deadline = asyncio.get_running_loop().time() + 60
    while asyncio.get_running_loop().time() < deadline:
        got = await api.get(f"/executions/{pk}/output", params={"since": since, "wait": 1, "stream": stream})
        if got.status_code == 503:
            continue
        assert got.status_code == 200, got.text
        answer = got.json()
        assert answer["offset"] == since and answer["lost"] == 0, answer  # never a silent gap
        seen += base64.b64decode(answer["data"])
        since = answer["next"]
        if (until and until in seen) or answer["final"]:
            return seen, answer
    raise AssertionError(f"{stream} never showed {until!r}: {seen!r}")


async def _write(api: httpx.AsyncClient, pk: int, seq: int, data: bytes = b"", eof: bool = False) -> httpx.Response:
    body = {"seq": seq, "data_b64": base64.b64encode(data).decode(), "eof": eof}
    return await api.post(f"/executions/{pk}/input", json=body)


@pytest.mark.bridge
@pytest.mark.django_db(transaction=True)
async def test_a_command_on_pipes_keeps_its_streams_apart_takes_stdin_and_exits_as_itself(stack, place, operator, bob):
    for backend in ("local", "tmux", "docker"):  # host shells: staff only
        machine = await sync_to_async(place)(backend, f"pipes-{backend}")
        await sync_to_async(grant)(bob, machine, "use")  # bob may use the machine, not reach operator's work
        async with await sync_to_async(_api)(stack, operator) as api:
            spec = {"scope": "pipes", "id": backend, "machine": machine.name, "argv": ["sh", "-c", SCRIPT]}
            submitted = await api.post("/executions", json={**spec, "pty": False})
            assert submitted.status_code == 201, submitted.text
            execution = submitted.json()["execution"]
            pk = execution["id"]
            assert (execution["pty"], execution["spec"]["pty"]) == (False, False)

            # Live: each stream by its own offsets while the command waits for its stdin.
            assert (await _read(api, pk, "stdout", until=b"out1"))[0] == b"out1"
            assert (await _read(api, pk, "stderr", until=b"no-tty"))[0] == b"err1 no-tty"
            assert (await _read(api, pk, "stderr", since=4, until=b"tty"))[0] == b" no-tty"

            binary = bytes(range(256)) * 4 + b"\r\n\x04\x03 end\n"  # every byte, ^D and ^C as data
            assert (await _write(api, pk, 0, b"hello\n")).json() == {"written": True, "repeated": False, "seq": 0}
            assert (await _write(api, pk, 0, b"hello\n")).json()["repeated"] is True  # a retry: written once
            conflict = await _write(api, pk, 0, b"other\n")
            assert (conflict.status_code, conflict.json()["code"]) == (409, "input_conflict")
            gap = await _write(api, pk, 5, b"x")
            assert (gap.status_code, gap.json()["code"], gap.json()["expected"]) == (409, "input_gap", 1)
            assert (await _write(api, pk, 1, binary)).json()["written"] is True
            assert (await _read(api, pk, "stdout", since=4, until=b"end\n"))[0] == b"hello\n" + binary
            assert (await _write(api, pk, 2, eof=True)).json()["written"] is True  # cat reads its end

            ended = (await api.get(f"/executions/{pk}/await", params={"timeout": 30})).json()
            assert ended["final"], ended
            assert (ended["execution"]["state"], ended["execution"]["exit_code"]) == ("completed", 3)

            # The record: the same streams, the same offsets; both in the order they came, each piece placed.
            out, answer = await _read(api, pk, "stdout")
            assert out == b"out1hello\n" + binary and answer["source"] == "record" and answer["end"] == len(out)
            assert (await _read(api, pk, "stderr"))[0] == b"err1 no-ttydone\n"
            both, answer = await _read(api, pk, "all")
            assert both.startswith(b"out1err1 no-tty") and both.endswith(b" end\ndone\n")
            assert len(both) == len(out) + 16 and answer["end"] == len(both)
            chunks = answer["chunks"]
            assert [c["stream"] for c in chunks[:2]] == ["stdout", "stderr"]
            assert chunks[-1] == {**chunks[-1], "stream": "stderr", "offset": 11, "seq": len(out) + 11}
            past = await api.get(f"/executions/{pk}/output", params={"stream": "stderr", "since": 17})
            assert (past.status_code, past.json()["code"]) == (416, "offset_out_of_range")
            async with api.stream("GET", f"/executions/{pk}/output/stream", params={"stream": "stderr"}) as pushed:
                lines = [line async for line in pushed.aiter_lines()]
            events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
            assert [e["text"] for e in events if "chunks" in e] == ["err1 no-ttydone\n"]  # pushed the same way
            assert events[-1]["execution"]["exit_code"] == 3
            late = await _write(api, pk, 3, b"too late")
            assert (late.status_code, late.json()["code"]) == (409, "state_conflict")

            # A command on a terminal has one stream and no stdin of its own.
            tty = await api.post("/executions", json={**spec, "id": f"{backend}-tty", "argv": ["true"]})
            tty_pk = tty.json()["execution"]["id"]
            assert tty.json()["execution"]["pty"] is True and "pty" not in tty.json()["execution"]["spec"]
            refused = await api.get(f"/executions/{tty_pk}/output", params={"stream": "stderr"})
            assert (refused.status_code, refused.json()["code"]) == (409, "wrong_kind")
            refused = await _write(api, tty_pk, 0, b"x")
            assert (refused.status_code, refused.json()["code"]) == (409, "wrong_kind")
            await api.get(f"/executions/{tty_pk}/await", params={"timeout": 30})

        async with await sync_to_async(_api)(stack, bob) as stranger:  # another person's command does not exist
            for got in (await _write(stranger, pk, 3, b"x"), await stranger.get(f"/executions/{pk}/output")):
                assert (got.status_code, got.json()["code"]) == (404, "not_found")

    # The Python client: stdin written and closed, each stream read on its own, the pieces of both placed.
    raw = await sync_to_async(create_token)(operator, name="pipes-client", scopes=["read", "run"])
    await sync_to_async(_with_the_client)(f"http://127.0.0.1:{stack.ports[0]}", raw[1])


def _with_the_client(url: str, raw: str) -> None:
    with Client(url, raw) as client:
        argv = ["sh", "-c", "tr a-z A-Z; echo bye >&2"]
        execution = client.submit("pipes", "client", machine="pipes-local", argv=argv, pty=False).execution
        stdin = client.stdin(execution.id)
        assert stdin.write("hello ").repeated is False
        stdin.close("world\n")
        assert client.wait(execution.id, timeout=30).execution.exit_code == 0
        assert b"".join(piece.data for piece in client.output(execution.id, stream="stdout")) == b"HELLO WORLD\n"
        both = client.read(execution.id)
        assert [(c.stream, c.offset, c.seq, c.data) for c in both.chunks] == [
            ("stdout", 0, 0, b"HELLO WORLD\n"),
            ("stderr", 0, 12, b"bye\n"),
        ]


@pytest.mark.bridge
@pytest.mark.django_db(transaction=True)
async def test_a_command_on_pipes_goes_on_under_a_new_worker_with_its_streams_and_offsets(place, operator):
    stack = Stack()
    stack.extra_env |= {"TETHER_RECOVERY_SECONDS": "1"}
    try:
        await sync_to_async(stack.start)("local")
        machine = await sync_to_async(place)("local", "pipes-crash")
        async with await sync_to_async(_api)(stack, operator) as api:
            script = "printf before; printf e1 >&2; cat; printf after; printf e2 >&2; exit 4"
            spec = {"scope": "pipes", "id": "crash", "machine": machine.name, "argv": ["sh", "-c", script]}
            pk = (await api.post("/executions", json={**spec, "pty": False})).json()["execution"]["id"]
            assert (await _read(api, pk, "stdout", until=b"before"))[0] == b"before"
            assert (await _read(api, pk, "stderr", until=b"e1"))[0] == b"e1"
            first = stack.workers[0]
            first.send_signal(signal.SIGKILL)
            await sync_to_async(first.wait)()
            await sync_to_async(stack.start_worker)("local")
            for _ in range(60):  # the new owner adopts the held command
                written = await _write(api, pk, 0, b" middle ", eof=True)
                if written.status_code != 503:
                    break
                await asyncio.sleep(0.5)
            assert written.json()["written"] is True, written.text
            ended = (await api.get(f"/executions/{pk}/await", params={"timeout": 30})).json()
            assert (ended["execution"]["state"], ended["execution"]["exit_code"]) == ("completed", 4), ended
            assert (await _read(api, pk, "stdout", since=6))[0] == b" middle after"
            assert (await _read(api, pk, "stderr"))[0] == b"e1e2"
            both, answer = await _read(api, pk, "all")
            assert both == b"beforee1 middle aftere2" and answer["complete"] is True
    finally:
        await sync_to_async(stack.stop)()

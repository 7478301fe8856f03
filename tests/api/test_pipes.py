"""Commands without a terminal (`pty: false`): stdout and stderr kept apart, each readable by its own offset
and both by the order they came, stdin written once per number and closed, the exit as the program's own, on
every backend and across a SIGKILL of the worker holding it."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import pty
import select
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest
from asgiref.sync import sync_to_async
from tether_client import Client

from api.tokens import create_token
from executions import pipes
from terminals.owner.capture import PipesCapture
from tests.bridge.harness import Stack, wait_for
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
    # Where a worker's read starts: the first piece of the view with bytes at or after the offset.
    starts = {(view, since): pipes.starting_at(found, view, since) for view in pipes.View for since in (0, 6, 11, 12)}
    assert [starts[pipes.View.STDOUT, n].data for n in (0, 6, 11)] == [b"hello ", b"world\n", b"world\n"]
    assert starts[pipes.View.STDOUT, 12] is None and starts[pipes.View.STDERR, 0].data == b"oops\n"
    assert starts[pipes.View.STDERR, 6] is None and starts[pipes.View.ALL, 6].data == b"oops\n"

    # Kept from the middle of a line on (a buffer trimmed anywhere): the cut line is skipped, never guessed,
    # and what is gone before the first whole line is said, in each view's own offsets.
    cut = stream[5:]
    found = pipes.pieces(cut, 5)
    assert [p.data for p in found] == [b"oops\n", b"world\n"]
    assert pipes.first_and_end(found, pipes.View.STDOUT, whole=False) == (6, 12)
    read = pipes.read(found, pipes.View.STDOUT, 0, 1000, 6, 12)
    assert (read.data, read.offset, read.lost) == (b"world\n", 6, 6)

    # A view that kept nothing of what it lost: said once, and the read moves on (it once answered offset 0,
    # next 0 for ever).
    lost_all = pipes.read(found, pipes.View.STDERR, 0, 1000, 5, 5)
    assert (lost_all.data, lost_all.offset, lost_all.next, lost_all.lost) == (b"", 5, 5, 5)

    # A piece missing between two (a line a redraw cut): the read stops before it, the next one says it.
    gapped = [p for p in pipes.pieces(stream, 0) if p.data != b"oops\n"]
    read = pipes.read(gapped, pipes.View.ALL, 0, 1000, 0, 17)
    assert (read.data, read.next) == (b"hello ", 6)
    read = pipes.read(gapped, pipes.View.ALL, 6, 1000, 0, 17)
    assert (read.data, read.offset, read.lost, read.next) == (b"world\n", 11, 5, 17)

    # A worker's index: each line parsed once as the buffer grows, its front let go of.
    index, buffer = pipes.Index(), bytearray()

    def since(offset: int):
        return offset, bytes(buffer[offset - base :]), 0

    base = 0
    buffer += stream[:20]  # the first line whole, the second cut
    assert [p.data for p in index.update(since, 0)] == [b"hello "]
    buffer += stream[20:]
    assert [p.data for p in index.update(since, 0)] == [b"hello ", b"oops\n", b"world\n"]
    base = 30
    del buffer[:30]  # the front let go of, mid-line
    assert [p.data for p in index.update(since, 30)] == [b"world\n"]

    assert pipes.encode_input(b"x" * 1000, close=True).count(b"\n") == 3  # 768 + 232 bytes, then the end


HOLDER = Path(__file__).resolve().parents[2] / "build" / "tether-holder"


def _on_a_terminal(*argv: str, interrupt_at: bytes = b"") -> tuple[int, bytes, float]:
    """``argv`` on a terminal of its own: its wait status, what it printed there, and how long it took; with
    ``interrupt_at``, one SIGINT once the mux has said those bytes of its program's stdout."""
    started = time.monotonic()
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(argv[0], list(argv))
    seen = b""
    while True:
        try:
            ready, _, _ = select.select([fd], [], [], 10)
            chunk = os.read(fd, 65536) if ready else b""
        except OSError:
            chunk = b""
        if not chunk:
            break
        seen += chunk
        if interrupt_at and interrupt_at in b"".join(p.data for p in pipes.pieces(seen, 0)):
            os.kill(pid, signal.SIGINT)
            interrupt_at = b""
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return status, seen, time.monotonic() - started


def test_the_mux_passes_a_signal_once_ends_after_its_program_and_leaves_its_terminal_as_it_was():
    # One SIGINT to the mux reaches the program once (it was sent twice: to its group and to it).
    counter = (
        "import signal,time; n=[]; signal.signal(2, lambda *a: n.append(1)); "
        "print('ready', flush=True); time.sleep(1); print(len(n))"
    )
    status, seen, _ = _on_a_terminal(str(HOLDER), "mux", "--", sys.executable, "-c", counter, interrupt_at=b"ready")
    assert os.waitstatus_to_exitcode(status) == 0
    assert b"".join(p.data for p in pipes.pieces(seen, 0)) == b"ready\n1\n"
    # A background child that writes for ever does not hold the command's end for ever.
    status, seen, took = _on_a_terminal(
        str(HOLDER), "mux", "--", "/bin/sh", "-c", "(while :; do echo x; sleep .02; done) & exit 5"
    )
    assert os.waitstatus_to_exitcode(status) == 5 and took < 5
    # The terminal's modes as they were for whoever uses it after (tmux's shim writes its end there).
    status, seen, _ = _on_a_terminal("/bin/sh", "-c", f"{HOLDER} mux -- true; stty -a")
    modes = seen.split()
    assert b"icanon" in modes and b"echo" in modes and b"-icanon" not in modes, seen


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
            body = b'{"seq": 1, "data": "' + b"x" * 1_200_000 + b'"}'  # past the body limit: said in our words
            huge = await api.post(f"/executions/{pk}/input", content=body, headers={"Content-Type": "application/json"})
            assert (huge.status_code, huge.json()["code"]) == (413, "too_large") and "settings" not in huge.text
            assert (await _write(api, pk, 1, binary)).json()["written"] is True
            assert (await _read(api, pk, "stdout", since=4, until=b"end\n"))[0] == b"hello\n" + binary
            small = await api.get(f"/executions/{pk}/output", params={"stream": "stdout", "since": 4, "size": 3})
            assert (small.json()["text"], small.json()["next"]) == ("hel", 7)  # less than a line's bytes: read
            assert (await _write(api, pk, 2, eof=True)).json()["written"] is True  # cat reads its end
            after = await _write(api, pk, 3, b"after the end")
            assert (after.status_code, after.json()["code"]) == (409, "state_conflict")  # never dropped silently
            assert (await _write(api, pk, 2, eof=True)).json()["repeated"] is True  # its retry still answers

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
            late = await _write(api, pk, 4, b"too late")
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
        # A program that cannot be started did not start, as on a terminal (not an exit of 127 made up).
        missing = client.submit("pipes", "missing", machine="pipes-local", argv=["nosuchprog"], pty=False).execution
        ended = client.wait(missing.id, timeout=30).execution
        assert (ended.evidence, ended.exit_code) == ("spawn_failed", None), ended
        assert (ended.outcome, ended.raw["why"]) == (
            "Did not start",
            "could not start nosuchprog: No such file or directory",
        )
        # Cancelled while it waits on its stdin: ended by its worker, the reason kept with how it ended.
        waiting = client.submit("pipes", "waiting", machine="pipes-local", argv=["cat"], pty=False).execution
        wait_for(lambda: client.get(waiting.id).state == "running", what="cat running")
        client.cancel(waiting.id, reason="no longer needed")
        ended = client.wait(waiting.id, timeout=30).execution
        assert ended.evidence == "killed" and "no longer needed" in ended.raw["why"], ended.raw
        # 2 MB of stdout after a line of stderr: the record keeps that line (each stream's tail apart).
        argv = ["sh", "-c", "echo 'error: oops' >&2; head -c 2000000 /dev/zero"]
        loud = client.submit("pipes", "loud", machine="pipes-local", argv=argv, pty=False).execution
        assert client.wait(loud.id, timeout=60).execution.exit_code == 0
        said = client.read(loud.id, stream="stderr")
        assert (said.data, said.lost, said.final, said.raw["source"]) == (b"error: oops\n", 0, True, "record")
        out = client.read(loud.id, stream="stdout", since=2_000_000 - 10)
        assert (out.data, out.end) == (b"\0" * 10, 2_000_000)
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


def test_a_small_stderr_stays_in_the_record_however_much_stdout_follows_and_a_new_owner_joins_it():
    """The record keeps each stream's last bytes apart: an error said on stderr before 5 MB of stdout was
    pushed out of a record that kept the last 256 KiB of both together (seen from outside: stderr lost 73 of 73)."""
    err = _line(b"E", 0, 0, b"sha256: 1234\n")
    stream = err + b"".join(_line(b"O", n * 3000, 13, bytes([65 + n % 26]) * 3000) for n in range(100))
    capture = PipesCapture(64 * 1024)
    for at in range(0, len(stream), 7000):  # as it comes, cut anywhere
        capture.add(at, stream[at : at + 7000])
    found = pipes.pieces(capture.data, capture.start)
    first, end = pipes.first_and_end(found, pipes.View.STDERR, whole=capture.start == 0)
    assert pipes.read(found, pipes.View.STDERR, 0, 1000, first, end).data == b"sha256: 1234\n"
    first, end = pipes.first_and_end(found, pipes.View.STDOUT, whole=capture.start == 0)
    tail = pipes.read(found, pipes.View.STDOUT, 0, 10**6, first, end)
    assert tail.end == 300_000 and tail.lost == tail.offset > 250_000 and tail.data == stream_tail(tail.offset)
    # A new owner goes on from the record; the holder resends from an earlier offset, cut mid-line: nothing
    # twice, nothing lost, the last line added.
    again = PipesCapture(64 * 1024, start=capture.start, data=capture.data)
    more = _line(b"O", 300_000, 13, b"last\n")
    again.add(len(stream) - 5000, stream[-5000:] + more)
    found = pipes.pieces(again.data, again.start)
    first, end = pipes.first_and_end(found, pipes.View.STDOUT, whole=False)
    read = pipes.read(found, pipes.View.STDOUT, tail.offset, 10**6, first, end)
    assert read.data == stream_tail(tail.offset) + b"last\n" and read.lost == 0
    assert [p.data for p in found if p.stream is pipes.View.STDERR] == [b"sha256: 1234\n"]


def stream_tail(offset: int) -> bytes:
    """Bytes ``offset`` on of the stdout above: 100 runs of 3,000 letters."""
    return b"".join(bytes([65 + n % 26]) * 3000 for n in range(100))[offset:]

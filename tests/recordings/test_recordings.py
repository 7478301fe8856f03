"""Recordings over the real path: a shell's output, as the viewer got it, is the recording's output byte for byte;
keys are kept out unless input recording is on; a size bound says where it cut; a worker killed mid-session
leaves one recording the next owner carries on; downloads are audited."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import signal
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async

from recordings.asciicast import output_of
from recordings.models import Recording, RecordingState
from terminals.models import SessionEvent
from terminals.protocol import CloseCode
from tests.bridge.harness import (
    RECORDINGS_DIR,
    Stack,
    Viewer,
    http_get,
    open_viewer,
    session_cookie,
    wait_for,
    without_marks,
)

pytestmark = [pytest.mark.bridge, pytest.mark.django_db(transaction=True)]

SECRET = "hunter2-swordfish"


def saved(session_pk, generation: int = 1) -> Recording:
    def done():
        recordings = Recording.objects.filter(session_id=session_pk, generation=generation)
        return recordings.filter(state=RecordingState.SAVED).first()

    return wait_for(done, timeout=30, what="the recording to be saved")


def cast_of(stack: Stack, recording: Recording, cookie: str, fmt: str = "v3") -> list[bytes]:
    status, headers, body = http_get(stack.ports[0], f"/recordings/{recording.pk}/cast?download=1&format={fmt}", cookie)
    assert status == 200, body[:300]
    assert headers["Content-Type"].startswith("application/x-asciicast")
    assert "attachment" in headers["Content-Disposition"]
    return body.splitlines(keepends=True)


@pytest.fixture
def own_stack():
    """A stack of its own, with the settings a test gives it."""
    stacks = []

    def start(**env) -> Stack:
        stack = Stack(extra_env={"TETHER_RECORDING_FLUSH_SECONDS": "1", **env})
        stacks.append(stack)
        return stack.start(backends="local")

    yield start
    for stack in stacks:
        stack.stop()


async def test_the_cast_holds_the_sessions_output_byte_for_byte_and_none_of_the_keys_typed(stack, terminal, operator):
    viewer, session, cookie = await open_viewer(stack, terminal, operator)
    await viewer.type("printf 'héllo — 日本語 \\342\\234\\223\\n'\r")
    await viewer.type("stty -echo; read -r secret; stty echo; echo len=${#secret}\r")
    await asyncio.sleep(0.5)
    await viewer.type(f"{SECRET}\r")
    await viewer.read_until(b"len=17")
    await viewer.send_json({"type": "resize", "cols": 100, "rows": 30})
    await viewer.type("exit 7\r")
    assert (await viewer.wait_for("exit"))["exit_code"] == 7

    recording = await sync_to_async(saved)(session.pk)
    lines = await sync_to_async(cast_of)(stack, recording, cookie)
    header = json.loads(lines[0])
    assert header["version"] == 3 and header["term"]["cols"] == 80 and not header["tether"]["input_recorded"]
    assert header["tether"]["outcome"] == "Exited with code 7"
    events = [json.loads(line) for line in lines[1:] if not line.startswith(b"#")]
    assert output_of(lines) == bytes(viewer.output)  # every byte the viewer got, in order, nothing more
    assert "héllo — 日本語 ✓" in without_marks(output_of(lines)).decode()
    assert ["r", "100x30"] in [event[1:] for event in events]
    assert events[-1][1:] == ["x", "7"]
    assert not [event for event in events if event[1] == "i"]
    assert SECRET.encode() not in b"".join(lines)
    # The command typed at the prompt is a marker to jump to.
    assert any(event[1] == "m" and event[2].startswith("printf") for event in events)
    # v2 for tools that read only v2: absolute times, the exit as a marker.
    v2 = [json.loads(line) for line in await sync_to_async(cast_of)(stack, recording, cookie, "v2")]
    assert v2[0]["version"] == 2 and v2[0]["width"] == 80 and v2[-1][1:] == ["m", "the shell exited with status 7"]
    # The file at rest is compressed, and each download is on the record.
    assert recording.file.endswith(".cast.gz") and recording.file_bytes > 0

    def downloads():
        events = SessionEvent.objects.filter(session=session, kind="recording_downloaded")
        return list(events.values_list("detail", flat=True))

    assert [d["format"] for d in await sync_to_async(downloads)()] == ["v3", "v2"]


async def test_keys_are_recorded_when_input_recording_is_on(own_stack, terminal, operator):
    stack = await sync_to_async(own_stack)(TETHER_RECORD_INPUT="1")
    viewer, session, cookie = await open_viewer(stack, terminal, operator)
    await viewer.type("echo typed-$((6*7))\r")
    await viewer.read_until(b"typed-42")
    await viewer.type("exit\r")
    await viewer.wait_for("exit")
    recording = await sync_to_async(saved)(session.pk)
    lines = await sync_to_async(cast_of)(stack, recording, cookie)
    assert json.loads(lines[0])["tether"]["input_recorded"]
    typed = "".join(json.loads(line)[2] for line in lines[1:] if json.loads(line)[1] == "i")
    assert "echo typed-$((6*7))\r" in typed


async def test_a_recording_past_its_size_bound_says_where_it_was_cut(own_stack, terminal, operator):
    stack = await sync_to_async(own_stack)(TETHER_RECORDING_MAX_BYTES="20000")
    viewer, session, cookie = await open_viewer(stack, terminal, operator)
    await viewer.type("head -c 60000 /dev/zero | tr '\\0' y; echo; echo done-$((2+3))\r")
    await viewer.read_until(b"done-5")
    await viewer.type("exit 3\r")
    await viewer.wait_for("exit")
    recording = await sync_to_async(saved)(session.pk)
    lines = await sync_to_async(cast_of)(stack, recording, cookie)
    cut = json.loads(lines[0])["tether"]["truncated_at"]
    assert cut == recording.truncated_at and 0 < cut < 20000
    assert len(output_of(lines)) == cut  # the output up to the cut, nothing after it
    assert any(line.startswith(b"# recording cut here") for line in lines)
    markers = [json.loads(line)[2] for line in lines[1:] if not line.startswith(b"#") and json.loads(line)[1] == "m"]
    assert any(f"output offset {cut}" in label for label in markers)
    assert json.loads(lines[-1])[1:] == ["x", "3"]  # how it ended is recorded past the bound too


async def test_a_worker_killed_mid_session_leaves_one_recording_that_the_next_owner_carries_on(
    own_stack, terminal, operator
):
    stack = await sync_to_async(own_stack)()
    viewer, session, cookie = await open_viewer(stack, terminal, operator)
    await viewer.type("echo before-$((1+1))\r")
    await viewer.read_until(b"before-2")
    await asyncio.sleep(1.5)  # written: the recording keeps what came before the kill
    stack.workers[0].send_signal(signal.SIGKILL)
    stack.workers[0].wait()
    await sync_to_async(stack.start_worker)(backends="local")  # adopts the held shell
    await viewer.wait_for("attached", timeout=30)
    await viewer.type("echo after-$((2+2))\r")
    await viewer.read_until(b"after-4")
    await viewer.type("exit 5\r")
    await viewer.wait_for("exit")
    recording = await sync_to_async(saved)(session.pk)
    assert await sync_to_async(Recording.objects.filter(session=session).count)() == 1
    lines = await sync_to_async(cast_of)(stack, recording, cookie)
    output = without_marks(output_of(lines))
    assert output.count(b"before-2\r\n") == 1 and output.count(b"after-4\r\n") == 1
    assert b"not recorded" not in b"".join(lines)  # no hole: what the next owner replayed was recorded once
    assert json.loads(lines[-1])[1:] == ["x", "5"]


async def test_a_recording_is_only_for_those_who_may_see_its_session(stack, terminal, operator, alice):
    viewer, session, _ = await open_viewer(stack, terminal, operator)
    await viewer.type("exit\r")
    await viewer.wait_for("exit")
    recording = await sync_to_async(saved)(session.pk)
    stranger = await sync_to_async(session_cookie)(alice)
    for path in (f"/recordings/{recording.pk}/", f"/recordings/{recording.pk}/cast?download=1"):
        status, _, _ = await sync_to_async(http_get)(stack.ports[0], path, stranger)
        assert status == 404
    status, headers, _ = await sync_to_async(http_get)(stack.ports[0], f"/recordings/{recording.pk}/cast", "")
    assert status == 302 and headers["Location"].startswith("/accounts/login/")  # signed out
    with gzip.open(Path(RECORDINGS_DIR) / recording.file) as stored:  # kept compressed in the storage
        assert json.loads(stored.readline())["version"] == 3


async def test_a_shell_lost_with_its_worker_ends_its_recording_unknown_never_with_an_exit(
    own_stack, terminal, operator
):
    stack = await sync_to_async(own_stack)(TETHER_HOLDER="0")  # a plain PTY: it ends with its worker
    viewer, session, cookie = await open_viewer(stack, terminal, operator)
    await viewer.type("echo before-$((1+1))\r")
    await viewer.read_until(b"before-2")
    await asyncio.sleep(1.5)
    stack.workers[0].send_signal(signal.SIGKILL)
    stack.workers[0].wait()
    await sync_to_async(stack.start_worker)(backends="local")  # finds the shell gone: unknown
    recording = await sync_to_async(saved)(session.pk)
    lines = await sync_to_async(cast_of)(stack, recording, cookie)
    assert json.loads(lines[0])["tether"]["outcome"] == "Connection lost; outcome unknown"
    events = [json.loads(line) for line in lines[1:] if not line.startswith(b"#")]
    assert b"before-2" in output_of(lines)
    assert not [event for event in events if event[1] == "x"]  # no exit was observed, so none is written
    assert events[-1][1:] == ["m", "the shell's end: Connection lost; outcome unknown"]


async def test_a_worker_stopped_mid_stream_hands_its_recording_over_with_nothing_lost_or_twice(
    own_stack, terminal, operator
):
    stack = await sync_to_async(own_stack)(TETHER_VIEWER_CHECK_SECONDS="1")
    viewer, session, cookie = await open_viewer(stack, terminal, operator)
    await viewer.type(
        "for i in $(seq 0 79); do seq $((i*2000+1)) $((i*2000+2000)); sleep 0.05; done; echo __DO''NE__\r"
    )
    await viewer.read_until(b"\r\n20000\r\n", timeout=30)  # well into it: a busy shell, writes in flight
    attached = next(message for message in viewer.messages if message["type"] == "attached")
    stack.workers[0].terminate()  # SIGTERM: it writes what it took, lets the held shell go, and stops
    assert await viewer.wait_closed() == CloseCode.SERVER_RESTART
    await sync_to_async(stack.start_worker)(backends="local")
    # The page comes back to the adopter from where it was.
    again = await Viewer.open(stack.ports[0], session.id, cookie)
    await again.attach(since=viewer.offset, generation=attached["generation"], epoch=attached["epoch"])
    await again.read_until(b"__DONE__", timeout=60)
    await again.type("exit 4\r")
    await again.wait_for("exit", timeout=30)
    recording = await sync_to_async(saved)(session.pk)
    lines = await sync_to_async(cast_of)(stack, recording, cookie)
    output = without_marks(output_of(lines)).decode()
    numbers = [int(number) for number in re.findall(r"(?<![^\r\n])(\d+)(?=\r\n)", output)]
    assert numbers == list(range(1, 160_001))  # every line once, in order, across the two owners
    assert "not recorded" not in b"".join(lines).decode()
    assert json.loads(lines[-1])[1:] == ["x", "4"]


async def test_busybox_sh_in_a_container_has_its_commands_as_markers_and_its_exit(stack, terminal, operator):
    viewer, session, cookie = await open_viewer(stack, terminal, operator, "docker")
    await viewer.read_until(b"# ", timeout=30)  # its prompt
    await viewer.type("echo hi-$((1+1))\r")  # a line pasted whole, with its Enter
    await viewer.read_match(rb"hi-2\r\n[^\n]*# ")  # and the next prompt, as a person waits for it
    for key in "ls /nope":  # a line typed key by key
        await viewer.type(key)
    await viewer.read_until(b"ls /nope")
    await viewer.type("\r")
    await viewer.read_match(rb"No such file[^\n]*\n[^\n]*# ")  # and the next prompt
    await viewer.type("exit 4\r")
    await viewer.wait_for("exit")
    recording = await sync_to_async(saved)(session.pk)
    lines = await sync_to_async(cast_of)(stack, recording, cookie)
    events = [json.loads(line) for line in lines[1:] if not line.startswith(b"#")]
    assert [event[2] for event in events if event[1] == "m"] == ["echo hi-$((1+1))", "ls /nope", "exit 4"]
    assert [label for _, label in recording.markers] == ["echo hi-$((1+1))", "ls /nope", "exit 4"]
    assert events[-1][1:] == ["x", "4"]

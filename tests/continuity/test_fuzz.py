"""A browser sending garbage: over ten thousand random frames, no crash, and the shell still echoes."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import async_to_sync
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.bridge.harness import Stack, Viewer

pytestmark = [pytest.mark.continuity, pytest.mark.django_db(transaction=True)]

# Typed bytes stay on the command line (no newline, Ctrl-C, Ctrl-D or escape), so the fuzz cannot run
# a command in the shell; everything else about the frames is up to hypothesis.
SAFE_INPUT = st.binary(max_size=300).map(lambda b: bytes(c for c in b if 0x20 <= c < 0x7F and c != 0x5C))
SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=20)
JSON_VALUES = SCALARS | st.lists(SCALARS, max_size=3) | st.dictionaries(st.text(max_size=8), SCALARS, max_size=3)
CONTROL = st.fixed_dictionaries(
    {"type": st.sampled_from(["attach", "resize", "ack", "reset_", "ping", "keepalive", "nope", "takeover"])},
    optional={"cols": JSON_VALUES, "rows": JSON_VALUES, "offset": JSON_VALUES, "since": JSON_VALUES},
).map(json.dumps)
FRAMES = st.one_of(
    SAFE_INPUT,
    CONTROL,
    st.text(max_size=200),  # malformed JSON, mostly
    JSON_VALUES.map(json.dumps),  # valid JSON of the wrong shape
    st.just("x" * (64 * 1024 + 1)),  # oversized text
    st.just(b"y" * (64 * 1024 + 1)),  # oversized binary
)
BATCH, EXAMPLES = 50, 210  # 10,500 frames, unique within each batch


def _is_ping(frame: str) -> bool:
    try:
        message = json.loads(frame)
    except ValueError:
        return False
    return isinstance(message, dict) and message.get("type") == "ping" and len(frame.encode()) <= 64 * 1024


async def fuzz(port: int, session_id, cookie: str, frames: list) -> dict:
    """Send every frame, then a ping: the pong proves the server took them all, in order."""
    viewer = await Viewer.open(port, session_id, cookie)
    await viewer.attach()
    counts = {"error": 0, "pong": 0}
    # Every ping among the frames is answered too; the last pong is the one for the final ping.
    pings = sum(1 for frame in frames if isinstance(frame, str) and _is_ping(frame)) + 1

    async def read() -> None:
        while counts["pong"] < pings:
            frame = await viewer.ws.recv()
            if isinstance(frame, str):
                kind = json.loads(frame).get("type")
                if kind in counts:
                    counts[kind] += 1

    reader = asyncio.create_task(read())
    for index, frame in enumerate(frames):
        await viewer.ws.send(frame)
        if index % 100 == 0:
            await asyncio.sleep(0)  # let the reader keep up
    await viewer.send_json({"type": "ping"})
    await asyncio.wait_for(reader, 300)
    await viewer.close()
    return counts


def test_ten_thousand_random_frames_leave_the_session_working(terminal, operator):
    # The repeat-offender limit is lifted so every frame reaches the consumer; it is tested on its own.
    stack = Stack(extra_env={"TETHER_STRIKE_LIMIT": "1000000"})
    frames: list = []

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )
    @given(st.lists(FRAMES, min_size=BATCH, max_size=BATCH, unique_by=repr))
    def generate(batch):
        frames.extend(batch)

    generate()
    assert len(frames) >= 10_000
    try:
        stack.start("docker")
        session, cookie = terminal(operator, "docker")  # the shell runs in a throwaway container, no network

        async def fuzz_then_echo():
            counts = await fuzz(stack.ports[0], session.id, cookie, frames)
            viewer = await Viewer.open(stack.ports[0], session.id, cookie)
            await viewer.attach()
            await viewer.type(b"\x03")  # throw away the junk typed on the command line
            await viewer.type("echo fuzz-$((6*7))\r")
            await viewer.read_until(b"fuzz-42")
            return counts

        counts = async_to_sync(fuzz_then_echo)()
    finally:
        stack.stop()
    assert counts["error"] > 1000, "bad frames must be answered with errors"
    session.refresh_from_db()
    assert session.generation == 1, "the fuzz must not have reset or replaced the shell"

"""The path end to end: browser socket -> daphne -> Redis -> owner worker -> process, and back."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from websockets.exceptions import InvalidStatus

from executions import actions as exec_actions
from executions.models import Evidence, Execution, ExecutionEvent, State
from terminals.backends.procfs import ProcessIdentity
from terminals.models import ProcessLease
from terminals.protocol import CloseCode
from tests.bridge.harness import Stack, Viewer, http_post, open_viewer, session_cookie
from tests.factories import TEST_ACTOR, make_spec

pytestmark = [pytest.mark.bridge, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("backend", ["local", "tmux", "docker"])
async def test_echo_round_trip(stack, terminal, operator, backend):
    # On uvloop (TETHER_WORKER_LOOP's default), which once hung at the first tmux new-session: see below.
    assert "uvloop" in (Path("/proc") / str(stack.workers[0].pid) / "maps").read_text()
    viewer, _session, _cookie = await open_viewer(stack, terminal, operator, backend)
    attached = viewer.messages[-1]
    assert attached["process_state"] == "live"
    await viewer.type("echo tether-$((6*7))\r")
    await viewer.read_until(b"tether-42")
    await viewer.close()


async def test_a_worker_told_asyncio_runs_on_it_and_starts_tmux_and_held_shells(terminal, operator):
    """Workers run on uvloop unless told (test_echo_round_trip runs there: on uvloop the worker's first tmux
    new-session, which forks the tmux server, never returned while its programs were started as uvloop's
    subprocesses; terminals/children.py). asyncio's loop stays a choice that works."""
    stack = Stack(extra_env={"TETHER_WORKER_LOOP": "asyncio"})
    try:
        stack.start(backends="local,tmux")
        assert "uvloop" not in (Path("/proc") / str(stack.workers[0].pid) / "maps").read_text()
        for backend in ("tmux", "local"):
            viewer, _session, _cookie = await open_viewer(stack, terminal, operator, backend)
            await viewer.type("echo loop-$((6*7))\r")
            await viewer.read_until(b"loop-42")
            await viewer.close()
    finally:
        stack.stop()


async def test_command_runs_once_and_its_exit_code_is_recorded(stack, place, tmp_path):
    counter = tmp_path / "launches"
    machine = await sync_to_async(place)("local", "cmd-box")
    spec = make_spec("sh", "-c", f"echo launched >> {counter}; exit 7")

    def submit():
        return exec_actions.submit_execution(
            scope="team-a", execution_id="deploy-1", machine_name=machine.name, spec=spec, actor=TEST_ACTOR
        )

    execution, created = await sync_to_async(submit)()
    assert created
    for _ in range(200):
        execution = await sync_to_async(Execution.objects.get)(pk=execution.pk)
        if execution.state == State.COMPLETED:
            break
        await asyncio.sleep(0.05)
    assert (execution.state, execution.evidence, execution.exit_code) == (State.COMPLETED, Evidence.EXITED, 7)
    again, created = await sync_to_async(submit)()
    assert not created and again.pk == execution.pk
    await asyncio.sleep(1.0)  # a worker that wrongly re-ran it would have appended by now
    assert counter.read_text() == "launched\n"


async def test_second_viewer_supersedes_the_first_with_4001(stack, terminal, operator):
    first, session, cookie = await open_viewer(stack, terminal, operator)
    await first.type("echo one-$((1+1))\r")
    await first.read_until(b"one-2")
    second = await Viewer.open(stack.ports[0], session.id, cookie)
    await second.attach()
    superseded = await first.wait_for("superseded")
    assert superseded["text"] == "Superseded by another window"
    assert await first.wait_closed() == CloseCode.SUPERSEDED
    assert first.ws.close_reason == "Superseded by another window"  # in the close frame too
    # The new viewer owns input and sees the same shell's history.
    await second.type("echo two-$((2+2))\r")
    output = await second.read_until(b"two-4")
    assert b"one-2" in output
    # The superseded window takes the session back explicitly: the other one gets 4001 in turn.
    back = await Viewer.open(stack.ports[0], session.id, cookie)
    await back.send_json({"type": "takeover", "since": 0, "cols": 80, "rows": 24})
    await back.wait_for("attached")
    assert await second.wait_closed() == CloseCode.SUPERSEDED
    await back.type("echo three-$((3+3))\r")
    assert b"two-4" in await back.read_until(b"three-6")


async def test_reset_gives_a_new_process(stack, terminal, operator):
    viewer, session, _cookie = await open_viewer(stack, terminal, operator)
    await viewer.type('sleep 1000 & echo "pid:$$:$!:"\r')
    match = await viewer.read_match(rb"pid:(\d+):(\d+):")
    first_pid, background = match.group(1), ProcessIdentity.of(int(match.group(2)))
    assert background.is_alive()
    await viewer.send_json({"type": "reset"})
    await viewer.wait_for("reset")
    # The whole tree ended, the background job too, before the fresh shell was started (a zombie
    # waiting for init to reap it has ended).
    assert not background.is_alive()
    await viewer.wait_for("attached")
    await viewer.type('echo "pid:$$:"\r')
    second_pid = (await viewer.read_match(rb"pid:(\d+):")).group(1)
    assert second_pid != first_pid
    old = await sync_to_async(lambda: Execution.objects.get(execution_id=f"terminal-{session.id}-1"))()
    assert (old.state, old.evidence) == (State.COMPLETED, Evidence.RESET)


async def test_resize_is_seen_by_stty(stack, terminal, operator):
    viewer, _session, _cookie = await open_viewer(stack, terminal, operator, cols=101, rows=31)
    await viewer.type("stty size\r")
    await viewer.read_until(b"31 101")
    await viewer.send_json({"type": "resize", "cols": 132, "rows": 43})
    await viewer.type("stty size\r")
    await viewer.read_until(b"43 132")
    # The limits are 1-500 columns by 1-200 rows: the largest grid is taken, one more is refused.
    await viewer.send_json({"type": "resize", "cols": 500, "rows": 200})
    await viewer.type("stty size\r")
    await viewer.read_until(b"200 500")
    for cols, rows in ((501, 200), (500, 201)):
        await viewer.send_json({"type": "resize", "cols": cols, "rows": rows})
        assert "500" in (await viewer.wait_for("error"))["message"]
    await viewer.type("echo size-$((1+1)); stty size\r")
    await viewer.read_until(b"size-2\r\n200 500")


async def test_foreign_user_and_bad_origin_are_refused(stack, terminal, alice, bob):
    session, alice_cookie = await sync_to_async(terminal)(alice, "docker")
    bob_cookie = await sync_to_async(session_cookie)(bob)
    with pytest.raises(InvalidStatus) as refused:
        await Viewer.open(stack.ports[0], session.id, bob_cookie)
    assert refused.value.response.status_code == 403
    with pytest.raises(InvalidStatus):
        await Viewer.open(stack.ports[0], session.id, alice_cookie, origin="http://evil.example")
    with pytest.raises(InvalidStatus):
        await Viewer.open(stack.ports[0], uuid.uuid4(), alice_cookie)
    with pytest.raises(InvalidStatus):
        await Viewer.open(stack.ports[0], session.id, "not-a-session")
    # Alice herself gets in.
    viewer = await Viewer.open(stack.ports[0], session.id, alice_cookie)
    await viewer.attach()


async def test_malformed_frames_get_errors_and_the_session_survives(stack, terminal, operator):
    viewer, session, cookie = await open_viewer(stack, terminal, operator)
    bad = [
        "{not json",
        "[1,2]",
        '{"type": 5}',
        '{"type": "launch_missiles"}',
        '{"type": "resize", "cols": 0, "rows": 9}',
        '{"type": "resize", "cols": 80, "rows": 999}',
        '{"type": "ack", "offset": -1}',
        "x" * (65 * 1024),
    ]
    for frame in bad:
        await viewer.ws.send(frame)
        error = await viewer.wait_for("error")
        assert error["message"]
    await viewer.ws.send(b"x" * (65 * 1024))
    assert "over the" in (await viewer.wait_for("error"))["message"]
    await viewer.type("echo alive-$((3*3))\r")
    await viewer.read_until(b"alive-9")
    # Over daphne's 1 MiB message limit the connection itself is dropped before Tether sees the frame
    # (autobahn fails it as "message too big"); the session is untouched and the page reconnects to
    # the same shell.
    await viewer.ws.send(b"x" * (2 * 1024 * 1024))
    assert await viewer.wait_closed() in (1006, 1009)
    again = await Viewer.open(stack.ports[0], session.id, cookie)
    await again.attach()
    await again.type("echo still-$((4*4))\r")
    assert b"alive-9" in await again.read_until(b"still-16")


async def test_worker_that_lost_its_lease_stops_writing_for_that_session(stack, terminal, operator):
    viewer, session, _cookie = await open_viewer(stack, terminal, operator)
    await viewer.type("echo before\r")
    await viewer.read_until(b"before\r\n")

    def bump():
        lease = ProcessLease.objects.get(execution__terminal_session=session)
        ProcessLease.objects.filter(pk=lease.pk).update(token=lease.token + 1)
        return lease.execution_id

    execution_pk = await sync_to_async(bump)()
    closed = await viewer.wait_for("closed", timeout=10)
    assert closed["reason"] == "let_go"  # the worker let go of it: the shell itself goes on elsewhere

    def written():
        lease = ProcessLease.objects.get(execution_id=execution_pk)
        events = ExecutionEvent.objects.filter(execution_id=execution_pk).count()
        return Execution.objects.get(pk=execution_pk).state, lease.released_at, lease.expires_at, events

    before = await sync_to_async(written)()
    await asyncio.sleep(3.5)  # three heartbeats (1 s each in the stack)
    after = await sync_to_async(written)()
    # The old owner wrote nothing more: no exit, no unknown, no event, and its heartbeat no longer
    # extends a lease it does not hold (whoever bumped the token owns the session now).
    assert after == before
    assert after[0] == State.RUNNING and after[1] is None
    # Uncovered: it lasts only to its own expiry, then recovery may take it over alone.
    assert not await sync_to_async(lambda: ProcessLease.objects.get(execution_id=execution_pk).covered)()


async def test_two_daphnes_and_two_workers_serve_sessions_whichever_daphne(terminal, operator):
    # Its own stack, so each worker can only take one kind of session: the two sessions land on
    # different workers, and every viewer below reaches the owner through either daphne.
    stack = Stack()
    try:
        stack.start_daphne()
        stack.start_daphne()
        local_worker = stack.start_worker("local")
        tmux_worker = stack.start_worker("tmux")
        sessions = [await sync_to_async(terminal)(operator, backend) for backend in ("local", "tmux")]
        for index, (session, cookie) in enumerate(sessions):
            first = await Viewer.open(stack.ports[index % 2], session.id, cookie)
            await first.attach()
            await first.type(f"echo s{index}-$((5*5))\r")
            await first.read_until(f"s{index}-25".encode())
            # Take over from the other daphne: same shell, earlier output replayed.
            second = await Viewer.open(stack.ports[(index + 1) % 2], session.id, cookie)
            await second.attach()
            assert await first.wait_closed() == CloseCode.SUPERSEDED
            await second.read_until(f"s{index}-25".encode())
            await second.type(f"echo again{index}\r")
            await second.read_until(f"again{index}\r\n".encode())
            await second.close()

        def owners():
            return [
                ProcessLease.objects.select_related("worker").get(execution__terminal_session=session).worker.pid
                for session, _cookie in sessions
            ]

        assert await sync_to_async(owners)() == [local_worker.pid, tmux_worker.pid]
    finally:
        stack.stop()


async def test_a_repeat_offender_is_closed_with_4008_and_the_session_is_unharmed(stack, terminal, operator):
    viewer, session, cookie = await open_viewer(stack, terminal, operator)
    for _ in range(60):
        await viewer.ws.send("{garbage")
    assert await viewer.wait_closed() == CloseCode.POLICY_VIOLATION
    assert any(m.get("reason") == "policy_violation" for m in viewer.messages)
    again = await Viewer.open(stack.ports[0], session.id, cookie)
    await again.attach()
    await again.type("echo unharmed-$((2*5))\r")
    await again.read_until(b"unharmed-10")


async def test_a_superseding_viewer_always_gets_its_replay_even_when_a_message_is_dropped(stack, terminal, operator):
    # channels-redis can drop a message while the superseded consumer in the same daphne closes
    # (django/channels_redis#366); the consumer checks attached.end and asks for a resend.
    first, session, cookie = await open_viewer(stack, terminal, operator)
    await first.type("echo replay-$((7*6))\r")
    await first.read_until(b"replay-42\r\n")
    for _ in range(15):
        viewer = await Viewer.open(stack.ports[0], session.id, cookie)
        attached = await viewer.attach()
        assert attached["end"] > attached["offset"]
        await viewer.read_until(b"replay-42\r\n", timeout=5)  # the shell is idle: only the replay can bring it


async def test_logging_out_closes_the_users_terminal_sockets(stack, terminal, operator):
    viewer, session, cookie = await open_viewer(stack, terminal, operator)
    await viewer.type("echo before-$((1+1))\r")
    await viewer.read_until(b"before-2")
    # Logged out the way the page's form does it, through daphne.
    status, _ = await asyncio.to_thread(http_post, stack.ports[0], "/accounts/logout/", cookie)
    assert status == 200
    assert await viewer.wait_closed(timeout=4) == CloseCode.FORBIDDEN  # at once: before the 5 s owner check
    assert any(m.get("reason") == "logged_out" for m in viewer.messages)
    # The shell itself is not the browser's: it keeps running for the next login.
    lease = await sync_to_async(ProcessLease.objects.get)(execution_id=session.execution_id)
    assert lease.released_at is None


async def test_a_window_that_missed_its_supersede_message_finds_out_from_the_database(terminal, operator):
    """The pub/sub layer keeps nothing for a moment's absence: the session row names the owning window."""
    from terminals.models import TerminalSession
    from tests.bridge.harness import Stack

    stack = Stack(extra_env={"TETHER_VIEWER_CHECK_SECONDS": "1"})
    try:
        await sync_to_async(stack.start)("local")
        viewer, session, _ = await open_viewer(stack, terminal, operator)
        await viewer.type("echo mine-$((3+3))\r")
        await viewer.read_until(b"mine-6")
        # Another window's attach was recorded, and its message to this one never came.
        await sync_to_async(TerminalSession.objects.filter(pk=session.pk).update)(viewer_id="another-window")
        assert await viewer.wait_closed(timeout=10) == CloseCode.SUPERSEDED
        assert any(m["type"] == "superseded" for m in viewer.messages)
    finally:
        await sync_to_async(stack.stop)()


def _subscriptions(stack, kind: str) -> list[bytes]:
    """Pub/sub channels in Redis under this stack's prefix: ``specific.`` for the consumers' own,
    ``tether.standing.`` for each daphne's standing one (the worker's are named otherwise)."""
    import redis

    client = redis.Redis.from_url(stack.redis_url)
    try:
        return client.pubsub_channels(f"{stack.prefix}{kind}*")
    finally:
        client.close()


async def test_viewers_that_leave_while_output_streams_leave_no_redis_subscriptions(stack, terminal, operator):
    """A viewer's channel is unsubscribed however its socket ends, even when an output message for it
    arrives in the same moment (channels' dispatch loop drops a receive that had already finished)."""
    viewer, session, cookie = await open_viewer(stack, terminal, operator)
    await viewer.type("yes tether-stream\r")
    await viewer.read_until(b"tether-stream\r\ntether-stream")
    await viewer.close()
    for _ in range(40):
        viewer = await Viewer.open(stack.ports[0], session.id, cookie)
        await viewer.attach()
        await viewer.read_until(b"tether-stream")
        await viewer.close()
    left: list[bytes] = []
    for _ in range(50):
        left = await asyncio.to_thread(_subscriptions, stack, "specific.")
        if not left:
            break
        await asyncio.sleep(0.1)
    assert left == [], f"{len(left)} viewer channels still subscribed after every viewer left"
    # On channels-redis's pub/sub layer daphne keeps one standing channel, so its reader keeps reading
    # for the next viewer; Tether's own layer reads its connection all the time and needs none.
    standing = 1 if settings.TETHER_CHANNEL_LAYER == "channels-pubsub" else 0
    assert len(await asyncio.to_thread(_subscriptions, stack, "tether.standing.")) == standing


async def test_a_viewer_gone_while_output_streams_is_let_go_by_the_worker(terminal, operator):
    """With no reconnect grace a departed viewer's session runs free. The worker must hear the viewer
    left even when the socket closed under a send of the replay, or it keeps the viewer's window
    and stops reading the shell."""
    stack = Stack(extra_env={"TETHER_RECONNECT_GRACE_SECONDS": "0", "TETHER_BUFFER_BYTES": "131072"})
    try:
        await sync_to_async(stack.start)("local")
        session, cookie = await sync_to_async(terminal)(operator, "local")
        viewer = await Viewer.open(stack.ports[0], session.id, cookie)
        first = await viewer.attach()
        stream = {"generation": first["generation"], "epoch": first["epoch"]}
        await viewer.type("yes tether-flood\r")
        await viewer.read_until(b"tether-flood\r\ntether-flood")
        since = viewer.offset
        await viewer.ws.close()
        for _ in range(3):
            await asyncio.sleep(1.5)
            viewer = await Viewer.open(stack.ports[0], session.id, cookie)
            attached = await viewer.attach(since=since, **stream)
            # The shell ran on while nobody watched: far more went by than the 128 KiB buffer holds.
            assert attached["lost"] > 1024 * 1024, attached
            since = attached["end"]
            await viewer.ws.close()  # in the middle of the replay
    finally:
        await sync_to_async(stack.stop)()

"""Every command typed into a terminal on the record, from a real bash's own marks, through the real
worker and socket: the right exit status for success, failure and signals; a forged mark changes nothing;
a command running when its worker is killed -9 is seen to its end where the shell is adopted, and is
unknown where the shell died with its worker."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from asgiref.sync import sync_to_async

from terminals.models import CommandRecord, CommandSource, TerminalSession
from terminals.protocol import CloseCode
from tests.bridge.harness import Stack, Viewer, open_viewer, wait_for

pytestmark = [pytest.mark.django_db(transaction=True)]


def _records(session_id) -> list[tuple]:
    rows = CommandRecord.objects.filter(session_id=session_id).order_by("id")
    return [(r.command, r.state, r.exit_status) for r in rows]


def _records_settle(session_id, count: int) -> list[tuple]:
    wait_for(
        lambda: len([r for r in _records(session_id) if r[1] != "running"]) >= count,
        timeout=15,
        what=f"{count} ended command records",
    )
    return _records(session_id)


async def _started(viewer: Viewer) -> dict:
    """The next command message with a record (the one saying the shell is tracked may come first)."""
    seen = len(viewer.messages)
    while True:
        for message in viewer.messages[seen:]:
            if message["type"] == "command" and message["record"] is not None:
                return message
        seen = len(viewer.messages)
        await viewer._next(20)


async def _ended(viewer: Viewer) -> dict:
    """The next command message saying a command ended."""
    seen = len(viewer.messages)
    while True:
        for message in viewer.messages[seen:]:
            if message["type"] == "command" and (message["record"] or {}).get("state", "running") != "running":
                return message
        seen = len(viewer.messages)
        await viewer._next(20)


async def _prompt(viewer: Viewer, token: str) -> None:
    await viewer.type(f"echo {token}-$((6*7))\r")
    await viewer.read_until(f"{token}-42".encode())


async def test_typed_commands_are_recorded_with_the_shells_own_status(stack, terminal, operator):
    viewer, session, _ = await open_viewer(stack, terminal, operator)
    await viewer.type("true\r")
    started = await _started(viewer)
    assert started["tracked"] and started["record"]["command"] == "true", started
    assert started["record"]["state"] == "running"
    await viewer.type("false\r")
    await viewer.type("echo out-$((2+3))\r")
    # Its output read before the next line is typed: keys typed ahead are echoed by the tty while it runs, inside
    # its byte range (CI run of stop 50: "sleep 30\r\n" before "out-5").
    await viewer.read_until(b"out-5\r\n")
    await viewer.type("sh -c 'kill -TERM $$'\r")
    await viewer.type("sleep 30\r")
    await viewer.read_for(0.5)
    await viewer.type("\x03")  # Ctrl-C: SIGINT to the foreground job
    # A program printing marks of its own (no nonce, or a wrong one): no record opens or closes by them.
    forged = r"printf '\033]133;D;0;tether=forged\007\033]133;C;cmdline=evil;tether=\007\033]133;C;cmdline=x\007'"
    await viewer.type(f"{forged}; sleep 0.3; (exit 4)\r")
    await viewer.type(" echo kept-out-of-history\r")  # bash in tests has no HISTCONTROL: history takes it
    await _prompt(viewer, "after")
    records = await sync_to_async(_records_settle)(session.id, 8)
    assert records[:7] == [
        ("true", "exited", 0),
        ("false", "exited", 1),
        ("echo out-$((2+3))", "exited", 0),
        ("sh -c 'kill -TERM $$'", "exited", 128 + 15),
        ("sleep 30", "exited", 128 + 2),
        (f"{forged}; sleep 0.3; (exit 4)", "exited", 4),
        (" echo kept-out-of-history", "exited", 0),
    ], records
    record = await sync_to_async(CommandRecord.objects.filter(command__startswith="echo out").get)()
    assert record.source == CommandSource.HISTORY and "end mark at offset" in record.evidence
    assert record.ended_at >= record.started_at
    # The byte range is the command's output in the session's stream as the viewer got it: all of it.
    assert bytes(viewer.output[record.output_start : record.output_end]) == b"out-5\r\n"

    # Under HISTCONTROL=ignoreboth (Debian's default): a repeat history does not take is still named (the
    # screen shows it typed again); a line kept out of history on purpose is kept out of the record too.
    for line in ("HISTCONTROL=ignoreboth", "echo same", "echo same", " echo secret-$((1+1))"):
        # Each at its own prompt (typed ahead, a line would be echoed before the prompt, not after it).
        await viewer.type(f"{line}\r")
        await _ended(viewer)
    await _prompt(viewer, "done")
    records = await sync_to_async(_records_settle)(session.id, 13)
    assert [r[0] for r in records[8:12]] == ["HISTCONTROL=ignoreboth", "echo same", "echo same", ""], records
    hidden = await sync_to_async(CommandRecord.objects.filter(session_id=session.id).order_by("id").__getitem__)(11)
    assert hidden.source == CommandSource.HIDDEN and hidden.state == "exited" and hidden.exit_status == 0


@pytest.mark.faults
@pytest.mark.parametrize("holder,adoption", [("1", "quick"), ("1", "slow"), ("0", "quick")])
async def test_worker_killed_mid_command(terminal, operator, holder, adoption, tmp_path):
    """kill -9 of the worker while a command runs; it ends (exit 3) once the next worker has adopted the
    session. Held (a session holder, or tmux, keeps the shell): the adopter reads the stream on and records
    the command's own end. ``slow``: the command ends while the adopter, its lease taken, is 4 s from
    attaching; a holder keeps that output (exit 3 still read), but tmux streams only what is printed once a
    client is attached, so the end mark is never read: the command is not called "exited", and the next
    command typed there ends it ``unknown``. Plain (the shell dies with its worker): unknown, never "exited"."""
    stack = Stack()
    stack.extra_env["TETHER_HOLDER"] = holder
    stack.extra_env["TETHER_RECOVERY_SECONDS"] = "1"
    flag = tmp_path / "go"
    line = f"until [ -e {flag} ]; do sleep 0.1; done; (exit 3)"
    try:
        await sync_to_async(stack.start_daphne)()
        first = await sync_to_async(stack.start_worker)("local,tmux")
        sessions, viewers = [], {}
        for backend in ("local", "tmux") if holder == "1" else ("local",):
            viewer, session, cookie = await open_viewer(stack, terminal, operator, backend)
            await viewer.type(f"{line}\r")
            await _started(viewer)  # on the record before the kill
            sessions.append(session)
            viewers[session.id] = (backend, viewer, cookie)
        first.kill()
        await sync_to_async(first.wait)()
        if adoption == "slow":
            stack.extra_env["TETHER_FAULT_POINTS"] = "adopt.taken:slow"
        await sync_to_async(stack.start_worker)("local,tmux")
        if holder == "1":
            # quick: adopted and attached; slow: its lease taken (tmux, taken last in id order, unattached)
            adopted = _lease_taken if adoption == "slow" else _adopted
            for session in sessions:
                await sync_to_async(wait_for)(lambda s=session, seen=adopted: seen(s), what="the adoption")
        flag.touch()
        for session in sessions:
            backend, viewer, cookie = viewers[session.id]
            if adoption == "slow" and backend == "tmux":
                await sync_to_async(wait_for)(lambda s=session: _adopted(s), what="the adoption")
                await asyncio.sleep(0.5)  # the end, long printed, is not read: still open
                assert await sync_to_async(_records)(session.id) == [(line, "running", None)]
                again = await Viewer.open(stack.ports[0], session.id, cookie)
                await again.attach()
                await again.type("true\r")
                records = await sync_to_async(_records_settle)(session.id, 2)
                assert records == [(line, "unknown", None), ("true", "exited", 0)], records
                record = await sync_to_async(CommandRecord.objects.filter(session_id=session.id).first)()
                assert "later command started" in record.evidence, record.evidence
                await again.close()
                continue
            try:
                records = await sync_to_async(_records_settle)(session.id, 1)
            except AssertionError as error:  # which shell, what it printed and what its record says
                found = await sync_to_async(_records)(session.id)
                tail = bytes(viewer.output[-600:])
                said = f"{error} ({backend}: records {found}; the page's last output {tail!r})"
                raise AssertionError(said) from error
            if holder == "1":
                assert records == [(line, "exited", 3)], (session, records)
            else:
                assert records == [(line, "unknown", None)], records
                record = await sync_to_async(CommandRecord.objects.get)(session_id=session.id)
                assert "ended first" in record.evidence, record.evidence
    finally:
        await sync_to_async(stack.stop)()


def _adopted(session) -> bool:
    """Its new owner has attached and said so (the ``adopted`` event comes after the attach)."""
    from executions.models import Evidence, ExecutionEvent

    return ExecutionEvent.objects.filter(execution_id=session.execution_id, evidence=Evidence.ADOPTED).exists()


def _lease_taken(session) -> bool:
    """A new owner has taken its lease over (token 2)."""
    from terminals.models import ProcessLease

    lease = ProcessLease.objects.filter(execution_id=session.execution_id, released_at__isnull=True).first()
    return bool(lease) and lease.token > 1


async def test_busybox_sh_in_a_container_is_tracked_from_its_prompts(stack, terminal, operator):
    """busybox ash marks no command's start: Enter at its prompt starts one, its next prompt's mark ends
    it with $? and the line its history took (a repeat it does not take keeps the typed line)."""
    viewer, session, _ = await open_viewer(stack, terminal, operator, "docker")
    answered = 0

    async def read_as_a_terminal(seconds: float) -> None:
        """Read on, answering the shell's cursor-position queries as a terminal does (busybox asks one at
        every prompt and redraws what was typed when no answer comes)."""
        nonlocal answered
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                await viewer._next(left)
            while bytes(viewer.output).count(b"\x1b[6n") > answered:  # at once, as xterm.js answers
                answered += 1
                await viewer.type("\x1b[1;5R")

    await read_as_a_terminal(0.5)
    for line in ("true", "false", "echo same", "echo same", "sleep 30"):
        await viewer.type(line)
        await read_as_a_terminal(0.3)  # the echo: what the screen shows typed at the prompt
        await viewer.type("\r")
        await read_as_a_terminal(0.3)
    await viewer.type("\x03")
    await read_as_a_terminal(0.3)
    await viewer.type("echo a-$((1+1))\recho b-$((2+2))\r")  # pasted: typed before their Enter was seen
    await read_as_a_terminal(1.0)
    await viewer.type("echo done-$((6*7))\r")
    await viewer.read_until(b"done-42")
    records = await sync_to_async(_records_settle)(session.id, 8)
    assert records[:7] == [
        ("true", "exited", 0),
        ("false", "exited", 1),
        ("echo same", "exited", 0),
        ("echo same", "exited", 0),
        ("sleep 30", "exited", 130),
        ("echo a-$((1+1))", "exited", 0),
        ("echo b-$((2+2))", "exited", 0),
    ], records
    pasted = await sync_to_async(
        CommandRecord.objects.filter(session_id=session.id, command__startswith="echo b").get
    )()
    assert "not marked by the shell" in pasted.evidence and pasted.output_start < pasted.output_end
    assert bytes(viewer.output[pasted.output_start : pasted.output_end]).endswith(b"b-4\r\n")


async def test_a_reset_ends_the_running_command_as_unknown_and_the_next_shell_is_tracked(stack, terminal, operator):
    viewer, session, _ = await open_viewer(stack, terminal, operator)
    await viewer.type("sleep 30\r")
    started = await _started(viewer)
    assert started["record"]["state"] == "running"
    await viewer.send_json({"type": "reset"})
    await viewer.wait_for("reset")
    record = await sync_to_async(CommandRecord.objects.get)(session_id=session.id, command="sleep 30")
    assert record.state == "unknown" and record.exit_status is None
    assert "the shell's session ended first" in record.evidence, record.evidence
    # The fresh shell (generation 2) has its own nonce and its commands are on the record too.
    await viewer.attach(generation=2)
    await viewer.type("true\r")
    message = await _started(viewer)
    assert message["record"]["command"] == "true" and message["record"]["generation"] == 2


async def test_zsh_is_tracked_and_a_machine_can_turn_tracking_off(stack, place, operator):
    from terminals import actions
    from tests.bridge.harness import session_cookie

    machine = await sync_to_async(place)("local")
    session, _ = await sync_to_async(actions.open_terminal)(machine, operator, shell=["/usr/bin/zsh", "-l"])
    viewer = await Viewer.open(stack.ports[0], session.id, await sync_to_async(session_cookie)(operator))
    await viewer.attach()
    await viewer.type("setopt hist_ignore_space\r")
    await viewer.type("echo a;(exit 5)\r")
    await viewer.type(" echo secret\r")  # kept out of history on purpose: out of the record too
    await viewer.type("sleep 30\r")
    await viewer.read_for(0.5)
    await viewer.type("\x03")
    await _prompt(viewer, "zsh")
    records = await sync_to_async(_records_settle)(session.id, 5)
    assert records[:4] == [
        ("setopt hist_ignore_space", "exited", 0),
        ("echo a;(exit 5)", "exited", 5),
        ("", "exited", 0),
        ("sleep 30", "exited", 130),
    ], records
    await viewer.type("echo dotdir=${ZDOTDIR-unset} marks=${TETHER_MARKS-unset}\r")
    await viewer.read_until(b"dotdir=unset marks=unset")  # the user's own ZDOTDIR (none: HOME) and no nonce

    # A machine with tracking off: its shell starts exactly as given, with no marks and no records.
    quiet = await sync_to_async(place)("local", "quiet-box")
    quiet.track_commands = False
    await sync_to_async(quiet.save)()
    session, _ = await sync_to_async(actions.open_terminal)(quiet, operator)
    viewer = await Viewer.open(stack.ports[0], session.id, await sync_to_async(session_cookie)(operator))
    await viewer.attach()
    await _prompt(viewer, "plain")
    assert b"\x1b]133;" not in viewer.output
    session = await sync_to_async(TerminalSession.objects.get)(pk=session.id)
    assert session.marks_note == "shell integration is off for this machine" and not session.marks_nonce
    assert await sync_to_async(_records)(session.id) == []


@pytest.mark.faults
async def test_a_line_pasted_into_busybox_sh_is_recorded_across_a_worker_kill(terminal, operator):
    """A line sent with its Enter in one frame (a paste, an API client), in a docker busybox shell, its worker
    SIGKILLed after a few MB of its output: no record ever appeared (6 of 6). busybox marks no command's
    start: the record of a pasted line is made at its end, from the history its end mark tells, compared with
    the history at the prompt before it, which the next owner never saw (the holder keeps the last 1 MiB).
    The session keeps where history stood, and the next owner goes on from it."""
    stack = Stack()
    stack.extra_env["TETHER_RECOVERY_SECONDS"] = "1"
    line = r"printf '\102EGIN\n'; seq 1 300000; printf '\105ND\n'"
    try:
        await sync_to_async(stack.start_daphne)()
        first = await sync_to_async(stack.start_worker)("docker")
        viewer, session, cookie = await open_viewer(stack, terminal, operator, "docker")
        await _prompt(viewer, "ready")
        await asyncio.sleep(0.5)  # the prompt's end mark read: where history stands
        await viewer.type(f"{line}\r")  # one frame, as a paste
        await viewer.read_until(b"BEGIN", timeout=30)
        while len(viewer.output) < 1_200_000:  # past what the holder keeps of the prompt before it
            await viewer._next(30)
        first.kill()
        await sync_to_async(first.wait)()
        await sync_to_async(stack.start_worker)("docker")
        await sync_to_async(wait_for)(lambda: _adopted(session), what="the adoption")
        again = await Viewer.open(stack.ports[0], session.id, cookie)
        await again.attach()
        # The first window, left open, follows its shell to the adopter by itself; the second, opened by a
        # person, keeps it (CI, stop 49: the first attached last and superseded the second mid-read).
        await again.read_until(b"END\r\n", timeout=120)
        assert await viewer.wait_closed(timeout=30) == CloseCode.SUPERSEDED
        await _prompt(again, "after")
        records = await sync_to_async(_records_settle)(session.id, 3)
        assert records[1] == (line, "exited", 0), records  # there was none
        assert records[2] == ("echo after-$((6*7))", "exited", 0), records
        await again.close()
    finally:
        await sync_to_async(stack.stop)()

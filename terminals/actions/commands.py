"""Commands typed into terminal sessions, on the record (terminals.models.CommandRecord).

The owner worker writes what the shell's marks say (each write fenced by its lease, so a worker that lost
the session writes nothing); a session's end makes its open command ``unknown`` in the same transaction
that records the shell's own end. Each record carries its evidence: how its start and its end are known.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from executions.models import Evidence, State
from terminals.actions.fencing import fenced
from terminals.models import CommandRecord, CommandSource, CommandState, TerminalSession, Worker

MAX_COMMAND_CHARS = 4000
# The shell's clock is believed within this much of ours (the same host's, or a container's on it).
CLOCK_SLACK = timedelta(minutes=10)
STOPPED = {128 + 19, 128 + 20, 128 + 21, 128 + 22}  # SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU
EXIT_BUILTIN = re.compile(r"^\s*(exit|logout)(\s+-?\d+)?\s*;?\s*$")


def _when(shell_time: float | None) -> datetime:
    """The shell's own time for a mark when it said one we can believe, else now."""
    now = timezone.now()
    if shell_time is not None:
        try:
            said = datetime.fromtimestamp(shell_time, tz=UTC)
        except (OverflowError, OSError, ValueError):
            return now
        if abs(said - now) <= CLOCK_SLACK:
            return said
    return now


def begin_marks(session_pk, generation: int, worker: Worker, token: int, execution_pk: int, nonce: str, note: str):
    """At a launch, before the shell starts: its nonce (or why its commands will not be tracked)."""
    with fenced(execution_pk, worker, token):
        TerminalSession.objects.filter(pk=session_pk, generation=generation).update(
            marks_nonce=nonce, marks_note=note[:200]
        )


def marks_seen(session_pk, generation: int, *, worker: Worker, token: int, execution_pk: int) -> bool:
    """The shell of ``generation`` marks its commands (its first prompt mark arrived). True when newly so."""
    with fenced(execution_pk, worker, token):
        changed = (
            TerminalSession.objects.filter(pk=session_pk, generation=generation)
            .exclude(marks_generation=generation)
            .update(marks_generation=generation)
        )
    return bool(changed)


def command_started(
    *,
    worker: Worker,
    token: int,
    execution_pk: int,
    session_pk,
    generation: int,
    stream: int,
    output_start: int,
    command: str,
    source: str,
    shell_time: float | None,
    evidence: str = "",
    prompt: int | None = None,
) -> tuple[CommandRecord, bool]:
    """The shell ran a command line: its record, running (created False when this mark was read before:
    a holder's stream read again by a new owner). A command still open before it never got its end.
    ``evidence``: how its start is known, when not from the shell's own command mark."""
    started_at = _when(shell_time)
    if not evidence:
        clock = "" if shell_time is None else " (the shell's clock)"
        evidence = f"started: the shell's command mark at offset {output_start}{clock}"
    with fenced(execution_pk, worker, token):
        found = CommandRecord.objects.filter(
            execution_id=execution_pk, stream=stream, output_start=output_start
        ).first()
        if found is not None:
            return found, False
        for earlier in _open_before(execution_pk, stream, output_start):
            _end_unknown(earlier, "a later command started before its end was seen (its end mark never arrived)")
        record = CommandRecord.objects.create(
            session_id=session_pk,
            execution_id=execution_pk,
            generation=generation,
            stream=stream,
            command=command[:MAX_COMMAND_CHARS],
            source=source,
            started_at=started_at,
            output_start=output_start,
            prompt=prompt,
            evidence=evidence,
        )
    return record, True


def command_finished(
    *,
    worker: Worker,
    token: int,
    execution_pk: int,
    stream: int,
    offset: int,
    status: int,
    shell_time: float | None,
    prompt: int | None = None,
) -> CommandRecord | None:
    """The shell's end mark at ``offset`` with ``status``, starting prompt ``prompt``: the open command
    typed at the prompt before it exited so. None when no command was open (a prompt after an empty line,
    or this mark was read before).

    Its end is believed only when it is this command's: the next prompt after the one it was typed at
    (bash, zsh number them), or, for a shell that does not, a mark in the same stream. A later prompt's
    mark (the command's own end came while no worker read the shell, and a tmux adoption does not replay
    it) or one from another owner's stream leaves it unknown. A stop (Ctrl-Z: 128 + SIGTSTP and its kin)
    is no end: the job may run on."""
    with fenced(execution_pk, worker, token):
        if _ended_at(execution_pk, stream, offset):
            return None
        record = _open_before(execution_pk, stream, offset).first()
        if record is None:
            return None
        if record.prompt is not None and prompt is not None:
            if prompt != record.prompt + 1:
                _end_unknown(record, f"its end was not seen (the shell's prompt {prompt} came after it)")
                return _fresh(record)
        elif record.stream != stream:
            _end_unknown(record, "its end may have come while no worker read the shell")
            return _fresh(record)
        if status in STOPPED:
            _end_unknown(record, f"stopped (status {status}: Ctrl-Z or a stop signal); it may run on")
            return _fresh(record)
        changed = CommandRecord.objects.filter(pk=record.pk, state=CommandState.RUNNING).update(
            state=CommandState.EXITED,
            exit_status=status,
            ended_at=max(_when(shell_time), record.started_at),
            output_end=offset,
            evidence=f"{record.evidence}; ended: the shell's end mark at offset {offset} with status {status}",
        )
        if not changed:
            return None
        record.refresh_from_db()
    return record


def command_ended_at_prompt(
    *,
    worker: Worker,
    token: int,
    execution_pk: int,
    session_pk,
    generation: int,
    stream: int,
    offset: int,
    status: int,
    line: str | None,
    since: tuple[int, float],
    last: str = "",
    history: dict | None = None,
) -> CommandRecord | None:
    """A POSIX shell's prompt mark at ``offset``: the last command ended with ``status``. ``line``: the line
    its history took since the last prompt, None when it took none (an empty line, a repeat, or a shell
    without history; ``last``: its last line all the same). The open command (opened when Enter was
    typed) ends so, named as history has it (a repeat history did not take is its last line again, as the
    screen showed it typed, redraws aside); with no open command but a
    line history took (pasted with others, typed before this owner saw its Enter), one is recorded at its
    end, started at the prompt before it (``since``: that prompt's end, offset and time). ``history``, where the
    shell's history stands now, is kept with the session for its next owner."""
    with fenced(execution_pk, worker, token):
        if history is not None:
            TerminalSession.objects.filter(pk=session_pk).update(marks_history=history)
        if _ended_at(execution_pk, stream, offset):
            return None
        ended = f"ended: the shell's prompt mark at offset {offset} with status {status}"
        record = _open_before(execution_pk, stream, offset).first()
        if record is not None and (record.stream != stream or status in STOPPED):
            why = "its end may have come while no worker read the shell" if record.stream != stream else ""
            _end_unknown(record, why or f"stopped (status {status}: Ctrl-Z or a stop signal); it may run on")
            return _fresh(record)
        if record is not None:
            updates = {"state": CommandState.EXITED, "exit_status": status, "ended_at": timezone.now()}
            updates |= {"output_end": offset, "evidence": f"{record.evidence}; {ended}"}
            named = line or (last if last and _squashed(last) == _squashed(record.command) else "")
            if named:
                updates |= {"command": named[:MAX_COMMAND_CHARS], "source": CommandSource.HISTORY}
            if not CommandRecord.objects.filter(pk=record.pk, state=CommandState.RUNNING).update(**updates):
                return None
            record.refresh_from_db()
            return record
        if not line:
            return None
        after, shown = since
        start = f"started: not marked by the shell; it ran after the prompt that ended at offset {after}"
        record, created = CommandRecord.objects.get_or_create(
            execution_id=execution_pk,
            stream=stream,
            output_start=after,
            defaults={
                "session_id": session_pk,
                "generation": generation,
                "command": line[:MAX_COMMAND_CHARS],
                "state": CommandState.EXITED,
                "exit_status": status,
                "started_at": datetime.fromtimestamp(shown, tz=UTC),
                "ended_at": timezone.now(),
                "output_end": offset,
                "evidence": f"{start}; {ended}",
            },
        )
    return record if created else None


def _ended_at(execution_pk: int, stream: int, offset: int) -> bool:
    """An end mark at ``offset`` was recorded already: read again (a holder's stream after a new owner)."""
    return CommandRecord.objects.filter(execution_id=execution_pk, stream=stream, output_end=offset).exists()


def _fresh(record: CommandRecord) -> CommandRecord:
    record.refresh_from_db()
    return record


def _squashed(text: str) -> str:
    return "".join(text.split())


def _open_before(execution_pk: int, stream: int, offset: int):
    """The open commands whose start comes before ``offset``: of the same stream by offset, and any of an
    older owner's stream (its offsets are not ours, but everything in it came first). Latest first."""
    earlier = Q(stream=stream, output_start__lte=offset)
    if stream:
        earlier |= Q(stream__lt=stream)
    return CommandRecord.objects.filter(earlier, execution_id=execution_pk, state=CommandState.RUNNING).order_by(
        "-stream", "-output_start"
    )


def _end_unknown(record: CommandRecord, why: str) -> bool:
    return bool(
        CommandRecord.objects.filter(pk=record.pk, state=CommandState.RUNNING).update(
            state=CommandState.UNKNOWN, ended_at=timezone.now(), evidence=f"{record.evidence}; unknown: {why}"
        )
    )


def end_open_commands(execution, why: str) -> int:
    """The shell's end is being recorded: a command still open has no end of its own to tell. It is
    unknown, except the shell's own ``exit``: its end is the shell's, when that end is a proven exit."""
    ended = 0
    for record in CommandRecord.objects.filter(execution_id=execution.pk, state=CommandState.RUNNING):
        if (
            execution.state == State.COMPLETED
            and execution.evidence == Evidence.EXITED
            and EXIT_BUILTIN.match(record.command)
        ):
            ended += CommandRecord.objects.filter(pk=record.pk, state=CommandState.RUNNING).update(
                state=CommandState.EXITED,
                exit_status=execution.exit_code,
                ended_at=timezone.now(),
                evidence=f"{record.evidence}; ended: it ended the shell, which exited with code {execution.exit_code}",
            )
        else:
            ended += _end_unknown(record, why)
    return ended


def summary(record: CommandRecord) -> dict:
    """A record as the page shows it."""
    duration = (record.ended_at - record.started_at).total_seconds() if record.ended_at else None
    return {
        "id": record.pk,
        "command": record.command if record.source not in (CommandSource.HIDDEN, CommandSource.EXPIRED) else "",
        "hidden": record.source == CommandSource.HIDDEN,
        "expired": record.source == CommandSource.EXPIRED,
        "state": record.state,
        "exit_status": record.exit_status,
        "started_at": record.started_at.isoformat(),
        "ended_at": record.ended_at.isoformat() if record.ended_at else None,
        "duration": duration,
        "generation": record.generation,
        "stream": record.stream,
        "output_start": record.output_start,
        "output_end": record.output_end,
        "evidence": record.evidence,
        # Why its outcome is unknown, in the record's words (the page's rail says it beside the command).
        "why": record.evidence.rpartition("unknown: ")[2] if record.state == CommandState.UNKNOWN else "",
    }


def session_commands(session: TerminalSession, limit: int = 200) -> list[dict]:
    """The session's latest ``limit`` commands, oldest first."""
    records = list(CommandRecord.objects.filter(session=session).order_by("-id")[:limit])
    return [summary(record) for record in reversed(records)]


def tracking(session: TerminalSession) -> dict:
    """Whether the session's current shell has its commands tracked, and if not, why not."""
    if session.marks_note:
        return {"tracked": False, "why": session.marks_note}
    if session.marks_generation == session.generation and session.marks_nonce:
        return {"tracked": True, "why": ""}
    if session.marks_nonce:
        return {"tracked": False, "why": "no prompt mark from the shell yet (its own setup may replace Tether's hook)"}
    return {"tracked": False, "why": "this shell was started without Tether's shell integration"}

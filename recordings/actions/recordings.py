"""Recordings: begun and written in chunks by the shell's owner (fenced by its lease), finished into one file
when the shell has ended (by its owner, or by any worker's sweep when the owner died), expired after the
retention, and read for playback and download (each one audited)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from executions.actions import Actor
from executions.models import ENDED_STATES, Evidence, State
from recordings import asciicast, store
from recordings.models import Recording, RecordingChunk, RecordingState
from terminals.actions.fencing import fenced
from terminals.actions.sessions import session_event
from terminals.models import TerminalSession, Worker

log = logging.getLogger(__name__)


def begin_recording(
    *, execution_pk: int, worker: Worker, token: int, cols: int, rows: int, started: float, stream: int
) -> Recording | None:
    """The execution's recording (one per shell), begun now unless an earlier owner began it; None for an
    execution that is no terminal session's. Fenced: only the shell's owner begins or resumes it."""
    with fenced(execution_pk, worker, token):
        session = TerminalSession.objects.filter(execution_id=execution_pk).first()
        if session is None:
            return None
        recording, _ = Recording.objects.get_or_create(
            execution_id=execution_pk,
            defaults={
                "session": session,
                "generation": session.generation,
                "started_at": datetime.fromtimestamp(started, tz=timezone.UTC),
                "started_epoch": started,
                "cols": cols,
                "rows": rows,
                "grid_cols": cols,
                "grid_rows": rows,
                "input_recorded": settings.TETHER_RECORD_INPUT,
                "stream": stream,
            },
        )
    return recording


def write_chunk(
    recording_pk: int,
    *,
    worker: Worker,
    token: int,
    execution_pk: int,
    number: int,
    taken: asciicast.Taken,
    file: str,
    data: bytes | None = None,
) -> bool:
    """Name chunk ``number``, whose events are already ``file`` in the recordings storage
    (store.save_chunk), or are ``data`` (kept in the row when the storage could not take them), with
    where the recording stands after it: a compare-and-set on the count, so a chunk is named once. True when it
    is named, by this call or by an earlier one whose answer was lost (the same file under the same number);
    False when the number went to another chunk or the recording is finished: nothing names ``file`` then."""
    current = Recording.objects.filter(pk=recording_pk, chunks=number, state=RecordingState.RECORDING)
    changes = {
        "chunks": F("chunks") + 1,
        "stream": taken.stream,
        "grid_cols": taken.grid[0],
        "grid_rows": taken.grid[1],
        "output_end": taken.end,
        "output_bytes": taken.output_bytes,
        "size": taken.size,
        "truncated_at": taken.truncated_at,
    }
    with fenced(execution_pk, worker, token):
        # Numbers from the one this owner began at are written by it alone (the lease): a row already there
        # with this file is this owner's own write, committed before the database's answer was lost.
        named = RecordingChunk.objects.filter(recording_id=recording_pk, number=number, file=file)
        if taken.markers:  # the list grows: read it (locked) to write it longer
            recording = current.select_for_update().only("markers").first()
            if recording is None:
                return named.exists()
            changes["markers"] = recording.markers + taken.markers
        if not current.update(**changes):  # the compare-and-set
            return named.exists()
        RecordingChunk.objects.create(recording_id=recording_pk, number=number, file=file, data=data)
    return True


# --- finishing ----------------------------------------------------------------------------------


def header(recording: Recording) -> dict:
    session = recording.session
    execution = recording.execution
    argv = list(execution.spec.get("argv", []))
    return {
        "term": {"cols": recording.cols, "rows": recording.rows, "type": asciicast.TERM_TYPE},
        "timestamp": int(recording.started_epoch),
        "title": f"{session.machine.name}: {session.user.get_username()}'s shell, generation {recording.generation}",
        "command": " ".join(argv),
        "env": {"TERM": asciicast.TERM_TYPE, **({"SHELL": argv[0]} if argv else {})},
        "tether": {
            "session": str(session.pk),
            "generation": recording.generation,
            "execution": f"{execution.scope}/{execution.execution_id}",
            "machine": session.machine.name,
            "user": session.user.get_username(),
            "input_recorded": recording.input_recorded,
            "outcome": execution.outcome_label if execution.state in ENDED_STATES else "",
            "truncated_at": recording.truncated_at,
        },
    }


def _closing_lines(recording: Recording) -> bytes:
    """How the shell ended, as its record says: the program's exit code only when it was observed (``x``);
    otherwise a marker with what is known. Past the size bound too."""
    execution = recording.execution
    at = execution.ended_at.timestamp() if execution.ended_at else timezone.now().timestamp()
    if execution.state == State.COMPLETED and execution.exit_code is not None and execution.evidence == Evidence.EXITED:
        return asciicast.event_line(at, "x", str(execution.exit_code))
    return asciicast.event_line(at, "m", f"the shell's end: {execution.outcome_label}")


class ChunksNotHere(Exception):
    """A recording's chunk files are not in this process's recordings storage (not shared with the host
    that wrote them), or the recording was made into its file while being read."""


def _chunks(recording: Recording) -> Iterator[bytes]:
    """The recording's chunks in order: each one's file (or its row's data: written by an earlier version, or
    when the storage could not take it). A file the storage lost while its others are there (removed by hand,
    lost with a disk) is a marker saying so, where it was: the rest still makes the file. When none of its
    files is here, or the recording was finished meanwhile, ChunksNotHere is raised (try again, elsewhere);
    so is any other error reading one."""
    rows = RecordingChunk.objects.filter(recording=recording).order_by("number").values_list("number", "file", "data")
    for number, file, data in rows.iterator(chunk_size=20):
        if not file:
            yield bytes(data)
        elif (stored := store.read_chunk(file)) is not None:
            yield stored
        elif not store.has_chunks(recording.pk):
            raise ChunksNotHere(
                f"recording {recording.pk}: its chunk files are not in this recordings storage (every host must"
                " share it: TETHER_RECORDINGS_DIR or TETHER_RECORDINGS_STORAGE)"
            )
        elif not Recording.objects.filter(pk=recording.pk, state=RecordingState.RECORDING).exists():
            raise ChunksNotHere(f"recording {recording.pk} was made into its file while it was read")
        else:
            log.warning("recording %s: chunk %d (%s) is not in the recordings storage", recording.pk, number, file)
            # At the time of the event before it (write_v3 keeps times in order): where the chunk was.
            lost = f"part of this recording is missing here (chunk {number} was not found)"
            yield asciicast.event_line(0.0, "m", lost)


def finish_recording(recording_pk: int) -> Recording | None:
    """The recording of a shell that has ended becomes one file: its chunks, then how the shell ended, under
    a header; the chunks' rows go (their files at the next cleanup). One transaction with the row locked, so
    two finishers save it once (a save cut short leaves the chunks, and the next sweep saves it again). None
    when it was finished already."""
    with transaction.atomic():
        recording = (
            Recording.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("execution", "session__machine", "session__user")
            .filter(pk=recording_pk, state=RecordingState.RECORDING)
            .first()
        )
        if recording is None or recording.execution.state not in ENDED_STATES:
            return None
        closing = _closing_lines(recording)
        last = list(asciicast.parse_lines(closing))[-1][0]
        recording.duration = max(last - recording.started_epoch, 0.0)
        name = f"{recording.session_id}/{recording.generation}-{recording.pk}.cast.gz"
        recording.file, recording.file_bytes = store.save(
            name, asciicast.write_v3(header(recording), _chunks(recording), recording.started_epoch, closing)
        )
        Recording.objects.filter(pk=recording.pk).update(
            state=RecordingState.SAVED,
            file=recording.file,
            file_bytes=recording.file_bytes,
            duration=recording.duration,
            finished_at=Now(),
        )
        # The chunk files stay until the cleanup (remove_leftover_chunks): a page playing the recording live
        # may still be reading them, and a file removed under a rolled-back finish would be lost.
        RecordingChunk.objects.filter(recording=recording).delete()
    return recording


def remove_leftover_chunks(*, dry_run: bool = False) -> int:
    """Remove the chunk files of recordings no longer being made (made into their file, or deleted): every
    file of theirs, named or not (a writer that died between writing a file and naming it leaves one). Returns
    how many files (that would go, with ``dry_run``)."""
    directories = store.chunk_dirs()
    being_made = set(
        Recording.objects.filter(pk__in=directories, state=RecordingState.RECORDING).values_list("pk", flat=True)
    )
    return sum(store.remove_chunks(pk, dry_run=dry_run) for pk in directories if pk not in being_made)


def unfinished_recordings() -> list[int]:
    """Recordings whose shell has ended and whose owner no longer holds it (it died, or finishing failed)."""
    return list(
        Recording.objects.filter(state=RecordingState.RECORDING, execution__state__in=sorted(ENDED_STATES))
        .exclude(execution__lease__released_at__isnull=True)
        .values_list("pk", flat=True)[:100]
    )


def expire_recordings(*, actor: Actor, days: int | None = None, dry_run: bool = False) -> list[Recording]:
    """Remove the files of recordings finished longer ago than the retention (``TETHER_RECORDING_RETENTION_DAYS``).
    The row stays (its times, markers and outcome), with a ``recording_expired`` event."""
    days = settings.TETHER_RECORDING_RETENTION_DAYS if days is None else days
    due = Recording.objects.filter(state=RecordingState.SAVED, finished_at__lt=Now() - timedelta(days=days))
    expired = []
    for recording in due.select_related("session"):
        if dry_run:
            expired.append(recording)
            continue
        with transaction.atomic():
            changed = Recording.objects.filter(pk=recording.pk, state=RecordingState.SAVED).update(
                state=RecordingState.EXPIRED, expired_at=Now()
            )
            if changed:
                # Only once the row says so: a file removed under a rolled-back change would be lost for good.
                transaction.on_commit(lambda name=recording.file: store.remove(name))
                session_event(
                    recording.session, "recording_expired", actor, f"finished more than {days} days ago",
                    recording=recording.pk, generation=recording.generation,
                )  # fmt: skip
                expired.append(recording)
    return expired


# --- reading ------------------------------------------------------------------------------------


def cast_lines(recording: Recording) -> Iterator[bytes]:
    """The recording as an asciicast v3 file: the saved file, or (still recording) what its chunks hold."""
    if recording.state == RecordingState.SAVED:
        return store.read(recording.file)
    return asciicast.write_v3(header(recording), _chunks(recording), recording.started_epoch)


def note_recording_seen(recording: Recording, user, how: str, *, format: str = "", link=None) -> None:
    """Audit who played or downloaded a recording (``how``: ``played`` or ``downloaded``), and through what."""
    detail = {"recording": recording.pk, "generation": recording.generation}
    if format:
        detail["format"] = format
    if link is not None:
        detail["share_link"] = link.pk
    via = f" through share link {link.pk}" if link is not None else ""
    session_event(recording.session, f"recording_{how}", Actor.for_user(user), f"{how}{via}", **detail)

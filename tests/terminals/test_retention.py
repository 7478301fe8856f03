"""Retention: a closed session keeps its final screen for 24 h; then cleanup removes the screen and keeps the rest."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db.models.functions import Now
from django.utils import timezone

from executions.models import Execution
from terminals import actions
from terminals.models import CloseReason, CommandRecord, SessionEvent, TerminalSession
from tests.factories import TEST_ACTOR

pytestmark = pytest.mark.django_db


def closed_session(place, user, name: str, hours_ago: float) -> TerminalSession:
    session, _ = actions.open_terminal(place("local", name), user)
    actions.close_session(
        session,
        reason=CloseReason.EXITED,
        actor=TEST_ACTOR,
        snapshot=b"final screen of " + name.encode(),
        output_offset=42,
    )
    TerminalSession.objects.filter(pk=session.pk).update(closed_at=Now() - timedelta(hours=hours_ago))
    return TerminalSession.objects.get(pk=session.pk)


def _typed(session: TerminalSession, line: str) -> CommandRecord:
    return CommandRecord.objects.create(
        session=session, execution=session.execution, generation=1, stream=0, command=line, state="exited",
        exit_status=0, started_at=timezone.now(), ended_at=timezone.now(), output_start=0,
    )  # fmt: skip


def test_cleanup_removes_only_expired_final_screens_and_keeps_the_records(place, operator, capsys):
    old = closed_session(place, operator, "old-box", 25)
    recent = closed_session(place, operator, "recent-box", 1)
    typed_old, typed_recent = _typed(old, "mysql -psecret"), _typed(recent, "make")
    live, _ = actions.open_terminal(place("local", "live-box"), operator)

    call_command("cleanup_terminals", "--dry-run")
    assert "1 session(s) would expire" in capsys.readouterr().out
    assert bytes(TerminalSession.objects.get(pk=old.pk).snapshot) == b"final screen of old-box"

    call_command("cleanup_terminals")
    assert f"expired the final screen of {old.id}" in capsys.readouterr().out
    old = TerminalSession.objects.get(pk=old.pk)
    assert bytes(old.snapshot) == b"" and old.expired_at is not None
    assert (old.close_reason, old.output_offset, old.generation) == (CloseReason.EXITED, 42, 1)
    assert Execution.objects.filter(pk=old.execution_id).exists()
    assert SessionEvent.objects.filter(session=old, kind="snapshot_expired").count() == 1
    # Typed command lines (which can hold secrets) go with the screen; their outcomes stay.
    typed_old.refresh_from_db()
    assert (typed_old.command, typed_old.source, typed_old.state, typed_old.exit_status) == ("", "expired", "exited", 0)
    assert CommandRecord.objects.get(pk=typed_recent.pk).command == "make"
    assert bytes(TerminalSession.objects.get(pk=recent.pk).snapshot) == b"final screen of recent-box"
    assert TerminalSession.objects.get(pk=live.pk).expired_at is None

    call_command("cleanup_terminals")  # nothing left to do: no second event
    assert "0 session(s) expired" in capsys.readouterr().out
    assert SessionEvent.objects.filter(session=old, kind="snapshot_expired").count() == 1


def saved_recording(session: TerminalSession, days_ago: float):
    from recordings import store
    from recordings.models import Recording

    name, size = store.save(f"{session.pk}/1-test.cast.gz", [b'{"version": 3}\n', b'[0.5, "o", "hi"]\n'])
    recording = Recording.objects.create(
        session=session, execution=session.execution, generation=1, state="saved", started_at=timezone.now(),
        started_epoch=0.0, cols=80, rows=24, file=name, file_bytes=size, markers=[[0.5, "make"]],
        finished_at=timezone.now() - timedelta(days=days_ago),
    )  # fmt: skip
    return recording


def test_cleanup_removes_recordings_past_their_retention_and_keeps_their_record(
    place, operator, capsys, django_capture_on_commit_callbacks
):
    from recordings import store

    old = saved_recording(closed_session(place, operator, "old-rec", 1), days_ago=31)
    recent = saved_recording(closed_session(place, operator, "new-rec", 1), days_ago=2)
    call_command("cleanup_terminals", "--dry-run")
    assert "1 recording(s) would be removed" in capsys.readouterr().out
    assert store.storage().exists(old.file)

    with django_capture_on_commit_callbacks(execute=True):  # the file goes once the row says so
        call_command("cleanup_terminals")
    assert f"removed recording {old.pk}" in capsys.readouterr().out
    old.refresh_from_db()
    assert old.state == "expired" and old.expired_at is not None and old.markers == [[0.5, "make"]]
    assert not store.storage().exists(old.file)
    assert store.storage().exists(recent.file)
    assert SessionEvent.objects.filter(session=old.session, kind="recording_expired").count() == 1

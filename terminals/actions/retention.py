"""Retention: the final screens of long-closed sessions are removed; their records stay."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now

from executions.actions import Actor
from terminals.actions.sessions import session_event
from terminals.models import CommandRecord, CommandSource, ProcessState, TerminalSession


def expire_closed_sessions(*, actor: Actor, hours: int | None = None, dry_run: bool = False) -> list[TerminalSession]:
    """Remove the final screens of sessions closed longer than the retention period (default 24 h).

    The session's identity, exit, close reason and output cursor stay, as do every execution record and
    event: only the bytes of the screen go, and the typed command lines (each command's state and status
    stay). Each removal is a compare-and-set with a ``snapshot_expired`` event.
    """
    hours = settings.TETHER_RETENTION_HOURS if hours is None else hours
    due = TerminalSession.objects.filter(
        process_state=ProcessState.CLOSED, expired_at__isnull=True, closed_at__lt=Now() - timedelta(hours=hours)
    ).order_by("closed_at")
    expired = []
    for session in due:
        if dry_run:
            expired.append(session)
            continue
        with transaction.atomic():
            changed = TerminalSession.objects.filter(pk=session.pk, expired_at__isnull=True).update(
                snapshot=b"", last_screen="", last_screen_exact=False, expired_at=Now(), updated_at=Now()
            )
            if changed:
                # Typed command lines can hold secrets (a password on a command line): they go with the
                # screen; each command's state, status and times stay.
                lines = CommandRecord.objects.filter(session=session).exclude(source=CommandSource.EXPIRED)
                blanked = lines.update(command="", source=CommandSource.EXPIRED)
                session_event(
                    session, "snapshot_expired", actor, f"closed more than {hours} h ago", hours=hours,
                    command_lines=blanked,
                )  # fmt: skip
                expired.append(session)
    return expired

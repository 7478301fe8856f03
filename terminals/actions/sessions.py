"""Terminal sessions: opening one, its next generation, closing it, who views it, take-overs, and the
viewer's preferences."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from access.fence import decided_again
from access.policy import Do
from executions import actions as exec_actions
from executions.actions import Actor
from executions.errors import Refused, TransitionRefused
from executions.models import Backend, Execution, Kind, Machine
from executions.spec import ExecutionSpec
from terminals.actions.permissions import in_use_refusal, may_use_machine, may_view_session
from terminals.models import ProcessState, SessionEvent, SnapshotKind, TerminalSession, ViewerPreference, Worker
from terminals.protocol import Via

if TYPE_CHECKING:  # annotations only: actions never import the emulator
    from terminals.screen import LastScreen


class NoLongerAllowed(Refused):
    """The open's decision, taken again inside its transaction, says no (access changed while it was on its way)."""


def session_event(session: TerminalSession, kind: str, actor: Actor, reason: str = "", **detail) -> None:
    SessionEvent.objects.create(
        session=session, kind=kind, actor=actor.label, user=actor.user, reason=reason, detail=detail
    )


def _shell_spec(machine: Machine, shell: list[str] | None = None) -> ExecutionSpec:
    argv = shell or (settings.TETHER_CONTAINER_SHELL if machine.backend == Backend.DOCKER else settings.TETHER_SHELL)
    return ExecutionSpec.build(argv)


def _submit_terminal(
    machine: Machine, actor: Actor, generation_label: str, shell: list[str] | None = None
) -> Execution:
    execution, _ = exec_actions.submit_execution(
        scope=machine.scope,
        execution_id=f"terminal-{generation_label}",
        machine_name=machine.name,
        spec=_shell_spec(machine, shell),
        actor=actor,
        kind=Kind.TERMINAL,
    )
    return execution


def open_terminal(
    machine: Machine, user, *, shell: list[str] | None = None, token=None
) -> tuple[TerminalSession, bool]:
    """The machine's open terminal session, or a new one. Returns (session, created).

    ``shell`` replaces the configured shell for a new session (the demo counts launches with it). ``token``: the
    API token asking for ``user``, which the decision inside the transaction is asked of.

    One open session per machine: opening again reattaches. A closed session of
    this user on this machine is reopened under the same id (a fresh shell).
    """
    if not may_use_machine(user, machine):
        raise Refused(f"you may not open a shell on {machine.name}")
    existing = (
        TerminalSession.objects.select_related("user")
        .filter(machine=machine, process_state__in=[ProcessState.LIVE, ProcessState.CLOSING])
        .first()
    )
    if existing is not None:
        if not may_view_session(user, existing):
            raise Refused(in_use_refusal(machine, existing, user))
        return existing, False
    actor = Actor.for_user(user)
    session_id = uuid.uuid4()
    try:
        with transaction.atomic():
            # The user's row is the lock: opens by one user queue here, so the count below holds until
            # this one commits (count-then-insert without it let six opens at once make six of five).
            # FOR NO KEY UPDATE: it queues one person's opens, and leaves the foreign-key checks of rows naming them
            # (a grant's or a machine's event, committed by a change holding the fence) free: no deadlock.
            get_user_model().objects.select_for_update(no_key=True).filter(pk=user.pk).first()
            # Decided again behind the fence: a revoke that committed while this open was on its way refuses
            # it; one that commits after closes its sockets, the shell runs on for operators (access/fence.py).
            if not decided_again(token or user, Do.USE, machine):  # an API token: as narrowed, and not revoked
                raise NoLongerAllowed(f"you may not open a shell on {machine.name}")
            live_count = TerminalSession.objects.filter(user=user, process_state=ProcessState.LIVE).count()
            if live_count >= settings.TETHER_SESSIONS_PER_USER:
                raise Refused(
                    f"you already have {live_count} open sessions (the limit is {settings.TETHER_SESSIONS_PER_USER}); "
                    "reattach to one of them or close one first"
                )
            execution = _submit_terminal(machine, actor, f"{session_id}-1", shell)
            session = TerminalSession.objects.create(id=session_id, machine=machine, user=user, execution=execution)
            session_event(session, "opened", actor)
    except IntegrityError:
        # Someone opened this machine's terminal at the same moment: attach to theirs.
        existing = TerminalSession.objects.get(machine=machine, process_state__in=[ProcessState.LIVE, "closing"])
        if not may_view_session(user, existing):
            raise Refused(in_use_refusal(machine, existing, user)) from None
        return existing, False
    return session, True


def start_next_generation(session: TerminalSession, actor: Actor, reason: str) -> TerminalSession:
    """Give a session a fresh shell: a new pending execution under the same session id.

    The previous execution must already be settled (its slot freed). Compare-and-set
    on the generation, so two resets racing start one new shell.
    """
    generation = session.generation + 1
    with transaction.atomic():
        execution = _submit_terminal(session.machine, actor, f"{session.id}-{generation}")
        changed = TerminalSession.objects.filter(pk=session.pk, generation=session.generation).update(
            execution=execution,
            generation=generation,
            process_state=ProcessState.LIVE,
            snapshot_kind=SnapshotKind.LIVE,
            snapshot_hidden=False,
            close_reason="",
            closed_at=None,
            expired_at=None,  # the new shell's screen is kept for its own retention, once it closes
            output_offset=0,
            updated_at=Now(),
        )
        if changed != 1:
            raise TransitionRefused(f"session {session.id}", "already restarted", "a new generation")
        session_event(session, "generation", actor, reason, generation=generation, execution=execution.execution_id)
    session.refresh_from_db()
    return session


def close_session(
    session: TerminalSession,
    *,
    reason: str,
    actor: Actor,
    snapshot: bytes | None = None,
    screen: LastScreen | None = None,
    output_offset: int = 0,
) -> bool:
    """live|closing -> closed with an archived snapshot. Returns False when it was already closed."""
    updates = {
        "process_state": ProcessState.CLOSED,
        "snapshot_kind": SnapshotKind.ARCHIVED,
        "close_reason": reason,
        "closed_at": Now(),
        "updated_at": Now(),
        "output_offset": output_offset,
    }
    if snapshot is not None:
        updates["snapshot"] = snapshot
    # Always written: a shell closed without one shows none, not an earlier generation's.
    updates["last_screen"] = screen.text.replace("\x00", "") if screen is not None else ""
    updates["last_screen_exact"] = screen is not None and screen.exact
    with transaction.atomic():
        changed = (
            TerminalSession.objects.filter(pk=session.pk, generation=session.generation)
            .exclude(process_state=ProcessState.CLOSED)
            .update(**updates)
        )
        if changed:
            session_event(session, "closed", actor, reason, generation=session.generation)
    return bool(changed)


def note_viewer(session_pk, worker: Worker, token: int, viewer_id: str | None = None) -> bool:
    """Remember when a viewer was last seen (idle reaping) and, on attach, which window owns the session.

    Written by the owner worker, so fenced like its other writes: False (nothing written) when this
    worker no longer holds the session's process under ``token``.
    """
    fields = {"last_viewer_at": Now()}
    if viewer_id is not None:
        fields["viewer_id"] = viewer_id
    return bool(
        TerminalSession.objects.filter(
            pk=session_pk,
            execution__lease__worker=worker,
            execution__lease__token=token,
            execution__lease__released_at__isnull=True,
        ).update(**fields)
    )


def note_takeover(session: TerminalSession, user) -> None:
    """Audit a staff member writing into another user's shell, as it happens (once, not per reconnect)."""
    last = SessionEvent.objects.filter(session=session).order_by("-at", "-id").first()
    if last is not None and last.kind == "taken_over" and last.user_id == user.pk:
        return
    session_event(
        session,
        "taken_over",
        Actor.for_user(user),
        f"{user.get_username()} took over {session.user.get_username()}'s shell",
        owner=session.user.get_username(),
    )


def note_observer(session: TerminalSession, user, via: Via) -> None:
    """Audit someone starting to watch a session read-only (once a socket; not again right after the same)."""
    last = SessionEvent.objects.filter(session=session).order_by("-at", "-id").first()
    if last is not None and last.kind == "observed" and last.user_id == user.pk and last.detail.get("via") == via:
        return
    how = f" through a {via}" if via == Via.SHARE_LINK else ""
    text = f"{user.get_username()} watches {session.user.get_username()}'s shell{how}"
    session_event(session, "observed", Actor.for_user(user), text, via=via or "owner")


def last_takeover(session: TerminalSession) -> dict | None:
    """Who last wrote into this session's shell without being its user (a take-over), and when; None if nobody
    has since its current shell started."""
    started = (
        SessionEvent.objects.filter(session=session, kind="generation").order_by("-at").values_list("at", flat=True)
    ).first() or session.created_at
    event = (
        SessionEvent.objects.filter(session=session, kind="taken_over", at__gte=started)
        .exclude(user_id=session.user_id)
        .select_related("user")
        .order_by("-at", "-id")
        .first()
    )
    return {"by": event.user.get_username(), "at": event.at.isoformat()} if event and event.user else None


def font_size_of(user) -> int:
    preference = ViewerPreference.objects.filter(user=user).first()
    return preference.font_size if preference else 14


def set_font_size(user, size: int) -> int:
    if size not in ViewerPreference.FONT_SIZES:
        sizes = ViewerPreference.FONT_SIZES
        raise exec_actions.UsageError(f"font size must be {sizes.start} to {sizes.stop - 1}, not {size}")
    ViewerPreference.objects.update_or_create(user=user, defaults={"font_size": size})
    return size

"""Requests to the owner of a running process, and the operator's actions on sessions: each is refused,
with the reason, when the state does not allow it."""

from __future__ import annotations

from django.db import transaction
from django.db.models.functions import Now

from executions import actions as exec_actions
from executions.actions import Actor
from executions.errors import TransitionRefused
from executions.models import Execution, ExecutionEvent
from terminals.actions.sessions import session_event
from terminals.models import ProcessLease, ProcessState, TerminalSession
from terminals.protocol import Request


def closed_by(execution_pk: int) -> dict:
    """Who asked the owner to end this execution's process, and why ({} when nobody did: it ended itself)."""
    asked = (
        ExecutionEvent.objects.select_related("user")
        .filter(execution_id=execution_pk, detail__has_key="requested")
        .order_by("-at", "-id")
        .first()
    )
    if asked is None:
        return {}
    by = asked.user.get_username() if asked.user else asked.actor.partition(":")[2] or asked.actor
    requested = asked.detail["requested"]
    why = "" if asked.reason == f"{requested} requested" else asked.reason
    return {"by": by, "action": requested, "why": why}


REQUESTABLE = frozenset(request.value for request in Request)  # each ends the process with its reason


def request_process_action(execution: Execution, action: str, *, actor: Actor, reason: str = "") -> ProcessLease:
    """Ask the owner of a running process to act on it. Compare-and-set: one request at a time."""
    if action not in REQUESTABLE:
        raise exec_actions.UsageError(f"unknown action {action!r}")
    with transaction.atomic():
        changed = ProcessLease.objects.filter(
            execution=execution, released_at__isnull=True, requested_action=""
        ).update(requested_action=action, requested_by=actor.label, requested_at=Now())
        lease = ProcessLease.objects.filter(execution=execution).first()
        if changed != 1:
            if lease is None or lease.released_at is not None:
                raise TransitionRefused(f"{execution}", execution.state, action, "no live process holds it")
            raise TransitionRefused(
                f"{execution}", execution.state, action, f"{lease.requested_action} already requested"
            )
        exec_actions.record_fact(
            execution, actor=actor, reason=reason or f"{action} requested", detail={"requested": action}
        )
    return lease


# Dismiss hides a closed session's final screen; the others are requests to the process's owner.
OPERATOR_ACTIONS = ("dismiss", Request.COMPLETE, Request.FAIL, Request.KILL, Request.RESET)


def operator_session_action(session: TerminalSession, action: str, *, actor: Actor, reason: str = "") -> None:
    """Dismiss hides the snapshot only; complete, fail, kill and reset ask the owner to act on the process.

    Each is refused, with the reason, when the session's state does not allow it.
    """
    if action not in OPERATOR_ACTIONS:
        raise exec_actions.UsageError(f"unknown operator action {action!r}")
    if action == "dismiss":
        with transaction.atomic():
            if not TerminalSession.objects.filter(pk=session.pk, snapshot_hidden=False).update(snapshot_hidden=True):
                raise TransitionRefused(f"session {session.id}", "dismissed", "dismissed", "already hidden")
            session_event(session, "dismissed", actor, reason)
        return
    if session.process_state == ProcessState.CLOSED:
        raise TransitionRefused(f"session {session.id}", "closed", action, "the process has already ended")
    with transaction.atomic():
        # The lease's row first, then the session's: the order of the owner's fenced transactions (a close took
        # the session's row, then waited for the lease the owner held while it waited for the session's).
        ProcessLease.objects.select_for_update().filter(execution_id=session.execution_id).first()
        if action == Request.COMPLETE:
            # The lease moves toward closing: no new viewer input is wanted, the process is asked to finish.
            if not TerminalSession.objects.filter(pk=session.pk, process_state=ProcessState.LIVE).update(
                process_state=ProcessState.CLOSING, updated_at=Now()
            ):
                raise TransitionRefused(f"session {session.id}", "closing", action, "it is already closing")
        request_process_action(session.execution, action, actor=actor, reason=reason)
        session_event(session, action, actor, reason)

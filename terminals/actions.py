"""Operations on workers, leases and terminal sessions. Each is a guarded write with its audit event.

Fencing: a worker's writes about a process go through ``fenced()``, which locks
the lease row only if it still names this worker and token. A worker that finds
zero rows has lost the lease and must let go of the process at once.
"""

from __future__ import annotations

import uuid
from contextlib import contextmanager
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import DateTimeField, ExpressionWrapper, Q, Value
from django.db.models.functions import Now

from executions import actions as exec_actions
from executions.actions import Actor
from executions.errors import Refused, TransitionRefused
from executions.models import Backend, Evidence, Execution, Kind, Machine, State
from executions.spec import ExecutionSpec
from terminals.backends.base import Launch
from terminals.models import (
    CloseReason,
    ProcessLease,
    ProcessState,
    SessionEvent,
    SnapshotKind,
    TerminalSession,
    ViewerPreference,
    Worker,
    WorkerEvent,
    WorkerState,
)


class LeaseLost(Refused):
    """This worker no longer owns the process: another claim bumped the token, or the lease was released."""


def _in(seconds: float):
    """The database clock plus ``seconds`` (never a worker's clock)."""
    return ExpressionWrapper(Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField())


# --- workers -------------------------------------------------------------------------------


def register_worker(*, worker_id: str, host: str, pid: int, started_at: int, boot_id: str, channel_name: str) -> Worker:
    return Worker.objects.create(
        worker_id=worker_id,
        host=host,
        pid=pid,
        process_started_at=started_at,
        boot_id=boot_id,
        channel_name=channel_name,
        heartbeat_at=Now(),
    )


def worker_heartbeat(worker: Worker, tokens: dict[int, int]) -> tuple[str, dict[int, tuple[int, str]]]:
    """Beat for the worker and extend the leases it holds under the tokens it was given.

    ``tokens`` is {execution id: token} as the worker knows them. A lease whose
    token moved on (another claim) is fenced off like any other write: it is not
    extended, so it expires and recovery can act on it.

    Returns the worker's state (``draining`` once drain_worker asked) and
    {execution id: (token, requested action)} for the leases in its name.
    """
    ttl = settings.TETHER_LEASE_TTL_SECONDS
    with transaction.atomic():
        Worker.objects.filter(pk=worker.pk).exclude(state=WorkerState.STOPPED).update(heartbeat_at=Now())
        state = Worker.objects.filter(pk=worker.pk).values_list("state", flat=True).get()
        # Locked, so no token can move between the comparison and the update.
        held = list(
            ProcessLease.objects.select_for_update()
            .filter(worker=worker, released_at__isnull=True)
            .values_list("pk", "execution_id", "token", "requested_action")
        )
        ours = [pk for pk, execution_pk, token, _request in held if tokens.get(execution_pk) == token]
        if ours:
            ProcessLease.objects.filter(pk__in=ours).update(heartbeat_at=Now(), expires_at=_in(ttl))
        return state, {execution_pk: (token, request) for _pk, execution_pk, token, request in held}


def _worker_event(worker: Worker, from_state: str, to_state: str, actor: Actor, reason: str = "", **detail) -> None:
    WorkerEvent.objects.create(
        worker=worker,
        from_state=from_state,
        to_state=to_state,
        actor=actor.label,
        user=actor.user,
        reason=reason,
        detail=detail,
    )


def stop_worker(worker: Worker, reason: str = "shut down") -> None:
    """running|draining -> stopped, with its event: the worker holds nothing it has not left for a later owner."""
    with transaction.atomic():
        current = Worker.objects.select_for_update().filter(pk=worker.pk).values_list("state", flat=True).first()
        if current is None or current == WorkerState.STOPPED:
            return
        Worker.objects.filter(pk=worker.pk).update(state=WorkerState.STOPPED, heartbeat_at=Now())
        # It has let go of what it leaves: expire those leases now, so the next recovery pass (a new
        # worker's first) takes them over at once instead of a TTL later.
        left = ProcessLease.objects.filter(worker=worker, released_at__isnull=True).update(expires_at=Now())
        _worker_event(
            worker, current, WorkerState.STOPPED, Actor.worker(worker.worker_id), reason, left_for_adoption=left
        )


def drain_worker(worker_id: str, *, actor: Actor, reason: str = "") -> Worker:
    """running -> draining (compare-and-set): the worker stops claiming, releases everything and stops."""
    matches = list(Worker.objects.filter(worker_id__startswith=worker_id)[:2]) if worker_id else []
    if len(matches) != 1:
        raise exec_actions.UsageError(
            f"no worker matches {worker_id!r}" if not matches else f"{worker_id!r} matches several workers"
        )
    worker = matches[0]
    with transaction.atomic():
        if Worker.objects.filter(pk=worker.pk, state=WorkerState.RUNNING).update(state=WorkerState.DRAINING) != 1:
            worker.refresh_from_db()
            raise TransitionRefused(f"worker {worker.worker_id}", worker.state, WorkerState.DRAINING)
        _worker_event(worker, WorkerState.RUNNING, WorkerState.DRAINING, actor, reason)
    worker.refresh_from_db()
    return worker


# --- claiming and fenced writes -------------------------------------------------------------


def claim_next_execution(worker: Worker, backends: set[str]) -> tuple[Execution, ProcessLease] | None:
    """Take the oldest pending execution this worker can run: pending -> dispatched, with a lease (token 1).

    ``dispatched`` is written before the process starts, so a crash from here on
    leaves a record that says the command may have run.
    """
    actor = Actor.worker(worker.worker_id)
    # A machine's processes live on its host: only a worker there may start them. One with no host yet (a
    # local, tmux or socket-docker machine from before hosts were recorded) is pinned to the first to claim.
    here = Q(machine__host=worker.host) | Q(machine__host="")
    with transaction.atomic():
        execution = (
            Execution.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("machine")
            .filter(here, state=State.PENDING, machine__backend__in=sorted(backends))
            .order_by("created_at", "id")
            .first()
        )
        if execution is None:
            return None
        machine = execution.machine
        if machine.needs_host and not machine.host:
            if not Machine.objects.filter(pk=machine.pk, host="").update(host=worker.host):
                return None  # pinned elsewhere a moment ago: not ours
            exec_actions.note_machine(machine, actor, f"pinned to host {worker.host}, whose worker claimed it first")
            machine.host = worker.host
        execution = exec_actions.transition(
            execution,
            State.DISPATCHED,
            evidence=Evidence.CLAIMED,
            actor=actor,
            detail={"worker": worker.worker_id, "machine_ref": machine.ref, "incarnation": machine.incarnation},
            ran_on_ref=machine.ref,
            ran_on_incarnation=machine.incarnation,
        )
        lease = ProcessLease.objects.create(
            execution=execution,
            worker=worker,
            token=1,
            handle={"launch": Launch.CLAIMED},  # a crash from here to begin_spawn provably started nothing
            heartbeat_at=Now(),
            expires_at=_in(settings.TETHER_LEASE_TTL_SECONDS),
        )
    lease.refresh_from_db()
    return execution, lease


@contextmanager
def fenced(execution_pk: int, worker: Worker, token: int):
    """A transaction in which this worker provably still holds the lease (row locked until commit)."""
    with transaction.atomic():
        lease = (
            ProcessLease.objects.select_for_update()
            .filter(execution_id=execution_pk, worker=worker, token=token, released_at__isnull=True)
            .first()
        )
        if lease is None:
            raise LeaseLost(f"worker {worker.worker_id} lost the lease on execution {execution_pk} (token {token})")
        yield lease


def fenced_transition(execution: Execution, to_state: str, *, worker: Worker, token: int, **kwargs) -> Execution:
    with fenced(execution.pk, worker, token):
        return exec_actions.transition(execution, to_state, actor=Actor.worker(worker.worker_id), **kwargs)


def save_handle(execution_pk: int, worker: Worker, token: int, handle: dict) -> None:
    with fenced(execution_pk, worker, token):
        ProcessLease.objects.filter(execution_id=execution_pk).update(handle=handle)


def lease_follows(execution_pk: int, worker: Worker, marker: str) -> bool:
    """Whether another worker now holds this execution's process by its marker: it found (adopted, watches)
    what ``worker`` started. If not, nobody observes that process and whoever started it must end it."""
    lease = ProcessLease.objects.filter(execution_id=execution_pk, released_at__isnull=True).first()
    return lease is not None and lease.worker_id != worker.pk and (lease.handle or {}).get("marker") == marker


def begin_spawn(execution: Execution, worker: Worker, token: int, intent: dict, instance: str) -> Execution:
    """Before the backend is asked to start anything: the intent (``launch``: spawning, with the tags'
    marker) and where it will run, in one fenced transaction. Recovery reads the intent if we die next."""
    with fenced(execution.pk, worker, token):
        execution = exec_actions.record_placement(execution, instance=instance, actor=Actor.worker(worker.worker_id))
        ProcessLease.objects.filter(execution_id=execution.pk).update(handle=intent)
    return execution


# --- terminal sessions ---------------------------------------------------------------------


def may_use_machine(user, machine: Machine) -> bool:
    """Host shells (local, tmux) are staff-only unless settings allow everyone."""
    if not user.is_authenticated or not user.is_active:
        return False
    if machine.backend in {Backend.LOCAL, Backend.TMUX} and not settings.TETHER_HOST_SHELLS_FOR_ALL:
        return user.is_staff
    return True


TAKEOVER_PERMISSION = "terminals.takeover_terminalsession"


def may_view_session(user, session: TerminalSession) -> bool:
    """Its owner, or staff allowed to take over another user's shell (which the user is then told)."""
    if not (user.is_authenticated and user.is_active):
        return False
    return session.user_id == user.pk or may_take_over(user, session)


def may_take_over(user, session: TerminalSession) -> bool:
    return session.user_id != user.pk and user.is_staff and user.has_perm(TAKEOVER_PERMISSION)


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


def closed_by(execution_pk: int) -> dict:
    """Who asked the owner to end this execution's process, and why ({} when nobody did: it ended itself)."""
    from executions.models import ExecutionEvent

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


def session_event(session: TerminalSession, kind: str, actor: Actor, reason: str = "", **detail) -> None:
    SessionEvent.objects.create(
        session=session, kind=kind, actor=actor.label, user=actor.user, reason=reason, detail=detail
    )


def open_terminal(machine: Machine, user, *, shell: list[str] | None = None) -> tuple[TerminalSession, bool]:
    """The machine's open terminal session, or a new one. Returns (session, created).

    ``shell`` replaces the configured shell for a new session (the demo counts launches with it).

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
            get_user_model().objects.select_for_update().filter(pk=user.pk).first()
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


def in_use_refusal(machine: Machine, session: TerminalSession, user) -> str:
    """Why ``user`` may not open ``machine``'s open shell, in their words."""
    if user.is_staff:
        return (
            f"{machine.name} has {session.user.get_username()}'s shell open; writing into another user's shell "
            'needs the permission "Can write into another user\'s shell"'
        )
    return f"{machine.name} is in use by another user's shell right now"


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
            output_offset=0,
            updated_at=Now(),
        )
        if changed != 1:
            raise TransitionRefused(f"session {session.id}", "already restarted", "a new generation")
        session_event(session, "generation", actor, reason, generation=generation, execution=execution.execution_id)
    session.refresh_from_db()
    return session


def close_session(
    session: TerminalSession, *, reason: str, actor: Actor, snapshot: bytes | None = None, output_offset: int = 0
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


def exit_record(exit) -> tuple[str, dict]:
    """The evidence and fields that record an observed exit (a ``backends.base.Exit``)."""
    if exit.code is None:
        return Evidence.SIGNALED, {"exit_signal": exit.signal}
    return (Evidence.EXIT_STATUS if exit.ambiguous else Evidence.EXITED), {"exit_code": exit.code}


def settle_execution(
    execution: Execution,
    *,
    worker: Worker,
    token: int,
    to_state: str,
    evidence: str,
    reason: str = "",
    close_reason: str = "",
    snapshot: bytes | None = None,
    output_offset: int = 0,
    restart_session: bool = False,
    **fields,
) -> Execution:
    """Record how a held process ended, release its lease and close its session: one fenced transaction.

    ``restart_session`` (a reset) starts the session's next generation in the same transaction, so the
    machine's slot passes straight from the ended shell to the fresh one: a command submitted at
    that moment is refused, as it would be a moment before.
    """
    actor = Actor.worker(worker.worker_id)
    # The execution keeps why its process was closed too: a command has no session to say so.
    close_reason = close_reason or CloseReason.EXITED
    with fenced(execution.pk, worker, token):
        execution = exec_actions.transition(
            execution, to_state, evidence=evidence, actor=actor, reason=reason, close_reason=close_reason, **fields
        )
        ProcessLease.objects.filter(execution_id=execution.pk).update(released_at=Now())
        session = TerminalSession.objects.select_related("machine").filter(execution=execution).first()
        if session is not None:
            close_session(
                session,
                reason=close_reason,
                actor=actor,
                snapshot=snapshot,
                output_offset=output_offset,
            )
            # Only a proven end frees the slot for a fresh shell; unknown keeps it until resolved.
            if restart_session and execution.state == State.COMPLETED:
                start_next_generation(session, actor, close_reason)
    return execution


REQUESTABLE = {"cancel", "kill", "fail", "complete", "reset"}


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


# --- operator actions on sessions ------------------------------------------------------------

OPERATOR_ACTIONS = ("dismiss", "complete", "fail", "kill", "reset")


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
        if action == "complete":
            # The lease moves toward closing: no new viewer input is wanted, the process is asked to finish.
            if not TerminalSession.objects.filter(pk=session.pk, process_state=ProcessState.LIVE).update(
                process_state=ProcessState.CLOSING, updated_at=Now()
            ):
                raise TransitionRefused(f"session {session.id}", "closing", action, "it is already closing")
        request_process_action(session.execution, action, actor=actor, reason=reason)
        session_event(session, action, actor, reason)


# --- retention -----------------------------------------------------------------------------


def expire_closed_sessions(*, actor: Actor, hours: int | None = None, dry_run: bool = False) -> list[TerminalSession]:
    """Remove the final screens of sessions closed longer than the retention period (default 24 h).

    The session's identity, exit, close reason and output cursor stay, as do every execution record and
    event: only the bytes of the screen go. Each removal is a compare-and-set with a ``snapshot_expired`` event.
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
                snapshot=b"", expired_at=Now(), updated_at=Now()
            )
            if changed:
                session_event(session, "snapshot_expired", actor, f"closed more than {hours} h ago", hours=hours)
                expired.append(session)
    return expired


# --- preferences ----------------------------------------------------------------------------


def font_size_of(user) -> int:
    preference = ViewerPreference.objects.filter(user=user).first()
    return preference.font_size if preference else 14


def set_font_size(user, size: int) -> int:
    if size not in ViewerPreference.FONT_SIZES:
        sizes = ViewerPreference.FONT_SIZES
        raise exec_actions.UsageError(f"font size must be {sizes.start} to {sizes.stop - 1}, not {size}")
    ViewerPreference.objects.update_or_create(user=user, defaults={"font_size": size})
    return size

"""Workers: registering, the heartbeat that extends the leases a worker holds, draining and stopping."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models.functions import Now

from executions import actions as exec_actions
from executions.actions import Actor
from executions.errors import TransitionRefused
from terminals.actions.leases import lease_expiry
from terminals.models import ProcessLease, Worker, WorkerEvent, WorkerState


def register_worker(
    *,
    worker_id: str,
    host: str,
    pid: int,
    started_at: int,
    boot_id: str,
    channel_name: str,
    backends=(),
    link: str = "",
) -> Worker:
    return Worker.objects.create(
        worker_id=worker_id,
        host=host,
        pid=pid,
        process_started_at=started_at,
        boot_id=boot_id,
        channel_name=channel_name,
        link=link,
        backends=sorted(backends),
        heartbeat_at=Now(),
        lease_until=lease_expiry(),
    )


def worker_heartbeat(worker: Worker, tokens: dict[int, int]) -> tuple[str, dict[int, tuple[int, str]]]:
    """Beat for the worker, which keeps every lease it covers: one row written, however many it holds.

    ``tokens`` is {execution id: token} as the worker knows them. A lease in its
    name under a token it does not know (it let go, or it is not told yet) is
    uncovered: it lasts only until its own expiry, after which recovery may take
    it over alone. A known one found uncovered is covered again. Both are
    compare-and-set on (worker, token), so nothing needs locking and a token
    that moved meanwhile is left alone.

    Returns the worker's state (``draining`` once drain_worker asked) and
    {execution id: (token, requested action)} for the leases in its name.
    """
    with transaction.atomic():
        Worker.objects.filter(pk=worker.pk).exclude(state=WorkerState.STOPPED).update(
            heartbeat_at=Now(), lease_until=lease_expiry()
        )
        state = Worker.objects.filter(pk=worker.pk).values_list("state", flat=True).get()
        held = list(
            ProcessLease.objects.filter(worker=worker, released_at__isnull=True).values_list(
                "execution_id", "token", "covered", "requested_action"
            )
        )
        for execution_pk, token, covered, _request in held:
            known = tokens.get(execution_pk) == token
            if known != covered:
                ProcessLease.objects.filter(
                    execution_id=execution_pk, worker=worker, token=token, released_at__isnull=True
                ).update(covered=known)
        return state, {execution_pk: (token, request) for execution_pk, token, _covered, request in held}


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
        Worker.objects.filter(pk=worker.pk).update(state=WorkerState.STOPPED, heartbeat_at=Now(), lease_until=Now())
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
    ttl = timedelta(seconds=settings.TETHER_LEASE_TTL_SECONDS)
    if Worker.objects.filter(pk=worker.pk, state=WorkerState.RUNNING, heartbeat_at__lt=Now() - ttl).exists():
        # A silent worker would never act on the drain: recovery is what takes its leases over.
        raise TransitionRefused(
            f"worker {worker.worker_id}",
            "presumed dead",  # (terminals.console.Shown.PRESUMED_DEAD: the console's word for it)
            WorkerState.DRAINING,
            f"it has not beaten for over {settings.TETHER_LEASE_TTL_SECONDS} s, so it would never act on a drain; "
            "its leases are taken over by recovery (a live worker's next pass, recover_terminals, or Run recovery)",
        )
    with transaction.atomic():
        if Worker.objects.filter(pk=worker.pk, state=WorkerState.RUNNING).update(state=WorkerState.DRAINING) != 1:
            worker.refresh_from_db()
            raise TransitionRefused(f"worker {worker.worker_id}", worker.state, WorkerState.DRAINING)
        _worker_event(worker, WorkerState.RUNNING, WorkerState.DRAINING, actor, reason)
    worker.refresh_from_db()
    return worker


def note_recovery_run(worker: Worker, actor: Actor, done: list[str], via: str) -> None:
    """Who ran a recovery pass by hand (the pass's own writes are its short-lived worker's), and what it did."""
    _worker_event(
        worker, WorkerState.RUNNING, WorkerState.RUNNING, actor, f"recovery pass run by hand ({via})",
        done=done[:100], via=via,
    )  # fmt: skip

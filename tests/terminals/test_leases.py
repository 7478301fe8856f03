"""Leases kept by their worker's heartbeat: one row written per beat, and every guarantee of a lease that
each beat extended (takeover only after expiry on the database clock, a stale owner fenced off, one lease
taken over alone while its worker goes on)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

from executions import actions as exec_actions
from executions.models import Evidence, State
from terminals import actions
from terminals.models import ProcessLease, Worker
from tests.factories import TEST_ACTOR, make_machine, make_spec

pytestmark = pytest.mark.django_db(transaction=True)


def worker(name: str) -> Worker:
    return actions.register_worker(
        worker_id=name, host=settings.TETHER_HOST, pid=1, started_at=1, boot_id="b", channel_name=f"c-{name}"
    )


def claimed(owner: Worker, count: int) -> dict[int, int]:
    """``count`` commands claimed by ``owner``: {execution pk: token}."""
    tokens = {}
    for n in range(count):
        machine = make_machine(f"lease-box-{owner.worker_id}-{n}")
        exec_actions.submit_execution(
            scope="team-a", execution_id=f"{owner.worker_id}-{n}", machine_name=machine.name, spec=make_spec(),
            actor=TEST_ACTOR,
        )  # fmt: skip
        execution, lease = actions.claim_next_execution(owner, {"local"})
        tokens[execution.pk] = lease.token
    return tokens


def writes(queries) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith(("UPDATE", "INSERT", "DELETE"))]


def age(model, pk: int, **changes) -> None:
    """Move expiries into the past, as time passing on the database's clock would."""
    model.objects.filter(pk=pk).update(**{field: Now() - timedelta(seconds=ago) for field, ago in changes.items()})


def test_a_heartbeat_writes_one_row_however_many_leases_its_worker_holds():
    owner = worker("w-many")
    tokens = claimed(owner, 40)
    actions.worker_heartbeat(owner, tokens)  # settles nothing: every lease is covered from its claim
    with CaptureQueriesContext(connection) as queries:
        state, held = actions.worker_heartbeat(owner, tokens)
    assert state == "running" and set(held) == set(tokens)
    assert len(writes(queries)) == 1 and '"terminals_worker"' in writes(queries)[0]


def test_a_covered_lease_is_taken_over_only_once_its_workers_heartbeat_has_expired():
    owner, rescuer = worker("w-owner"), worker("w-rescuer")
    (execution_pk, token), *_ = claimed(owner, 1).items()
    lease = ProcessLease.objects.get(execution_id=execution_pk)
    age(ProcessLease, lease.pk, expires_at=60)  # its own expiry long past: its worker's beat still keeps it
    assert actions.take_over_lease(lease, rescuer) is None
    actions.worker_heartbeat(owner, {execution_pk: token})
    assert actions.take_over_lease(lease, rescuer) is None

    age(Worker, owner.pk, lease_until=1)  # the owner went silent for a TTL
    assert actions.take_over_lease(lease, rescuer) == token + 1
    lease.refresh_from_db()
    assert (lease.worker_id, lease.token, lease.covered) == (rescuer.pk, token + 1, True)
    # The owner wakes up: its beat neither keeps the lease nor lets it write about the process.
    _state, held = actions.worker_heartbeat(owner, {execution_pk: token})
    assert execution_pk not in held
    with pytest.raises(actions.LeaseLost):
        actions.save_handle(execution_pk, owner, token, {"stale": True})
    # The rescuer's beat keeps it now, whatever the lease's own expiry says.
    age(ProcessLease, lease.pk, expires_at=60)
    actions.worker_heartbeat(rescuer, {execution_pk: token + 1})
    assert actions.take_over_lease(ProcessLease.objects.get(pk=lease.pk), owner) is None


def test_one_lease_its_worker_let_go_of_is_taken_over_alone_while_the_worker_goes_on():
    owner, rescuer = worker("w-goes-on"), worker("w-takes-one")
    tokens = claimed(owner, 2)
    (kept_pk, kept_token), (dropped_pk, _dropped_token) = tokens.items()
    actions.worker_heartbeat(owner, {kept_pk: kept_token})  # it no longer knows the other
    dropped = ProcessLease.objects.get(execution_id=dropped_pk)
    assert not dropped.covered and ProcessLease.objects.get(execution_id=kept_pk).covered
    assert actions.take_over_lease(dropped, rescuer) is None  # its own expiry (claim + TTL) not yet passed

    age(ProcessLease, dropped.pk, expires_at=1)
    age(ProcessLease, ProcessLease.objects.get(execution_id=kept_pk).pk, expires_at=1)
    assert actions.take_over_lease(dropped, rescuer) == dropped.token + 1
    assert actions.take_over_lease(ProcessLease.objects.get(execution_id=kept_pk), rescuer) is None
    # Still the owner's, still kept by its beats.
    assert ProcessLease.objects.filter(execution_id=kept_pk, worker=owner, covered=True).exists()


def test_a_lease_its_worker_learns_of_after_a_beat_is_covered_again():
    """A beat that runs between a claim and the worker taking note of it uncovers the new lease; the next
    one, knowing it, covers it again (its own claim-time expiry holds in between)."""
    owner = worker("w-late")
    tokens = claimed(owner, 1)
    actions.worker_heartbeat(owner, {})
    (execution_pk, _token), *_ = tokens.items()
    lease = ProcessLease.objects.get(execution_id=execution_pk)
    assert not lease.covered
    remaining = (lease.expires_at - ProcessLease.objects.annotate(now=Now()).get(pk=lease.pk).now).total_seconds()
    assert remaining > settings.TETHER_LEASE_TTL_SECONDS - 5
    actions.worker_heartbeat(owner, tokens)
    assert ProcessLease.objects.get(pk=lease.pk).covered


def test_stopping_a_worker_leaves_its_leases_for_adoption_at_once():
    owner, rescuer = worker("w-stops"), worker("w-adopts")
    (execution_pk, token), *_ = claimed(owner, 1).items()
    actions.fenced_transition(
        ProcessLease.objects.get(execution_id=execution_pk).execution, State.RUNNING, worker=owner, token=token,
        evidence=Evidence.OBSERVED,
    )  # fmt: skip
    actions.stop_worker(owner)
    # Expired as of the stop (Now() is the transaction's time: the next one sees it past).
    lease = ProcessLease.objects.get(execution_id=execution_pk)
    assert actions.take_over_lease(lease, rescuer) == token + 1


def test_a_takeover_waits_its_turn_behind_a_heartbeat_in_flight():
    """A beat updates its worker's row; a takeover locks that row before it reads the expiry. So a beat and
    a takeover at the same moment are ordered: never a takeover of a lease whose worker is beating."""
    owner, rescuer = worker("w-beating"), worker("w-waiting")
    (execution_pk, token), *_ = claimed(owner, 1).items()
    lease = ProcessLease.objects.get(execution_id=execution_pk)
    age(ProcessLease, lease.pk, expires_at=60)
    age(Worker, owner.pk, lease_until=1)  # silent for a TTL, and now, at this very moment, beating again
    locked, release = threading.Event(), threading.Event()

    def beat_in_flight():
        with transaction.atomic():
            Worker.objects.filter(pk=owner.pk).update(heartbeat_at=Now())  # the beat's first statement
            locked.set()
            release.wait(10)
        connections.close_all()

    beating = threading.Thread(target=beat_in_flight)
    beating.start()
    assert locked.wait(10)
    try:
        assert actions.take_over_lease(lease, rescuer) is None  # skipped this pass, not taken under the beat
    finally:
        release.set()
        beating.join()
    assert actions.take_over_lease(lease, rescuer) == token + 1  # that beat did not renew it: now it may

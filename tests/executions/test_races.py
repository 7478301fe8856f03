"""Concurrency on real PostgreSQL: many threads, one winner, clear errors for the rest."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models.functions import Now

from executions import actions
from executions.errors import ExecutionError, SlotTaken, TransitionRefused
from executions.models import Evidence, Execution, ExecutionEvent, Machine, State
from tests.factories import TEST_ACTOR, grant, make_execution, make_machine, make_spec, mark_resolved

pytestmark = pytest.mark.django_db(transaction=True)


def run_together(
    count: int, work: Callable[..., object], prepare: Callable[[int], object] | None = None
) -> list[object]:
    """Start ``count`` threads that call ``work(i)`` at the same instant; return results or exceptions.

    With ``prepare``, each thread first runs ``prepare(i)`` and only then waits at the barrier, and
    ``work(i, prepared)`` gets what it returned: every thread has read before any of them writes.
    """
    barrier = threading.Barrier(count)
    results: list[object] = [None] * count

    def target(index: int) -> None:
        try:
            if prepare is None:
                barrier.wait()
                results[index] = work(index)
            else:
                prepared = prepare(index)
                barrier.wait()
                results[index] = work(index, prepared)
        except Exception as error:  # collected and asserted on by the test
            results[index] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def test_twelve_concurrent_submits_of_one_identity_make_one_execution():
    machine = make_machine("busy")

    def submit(_: int):
        return actions.submit_execution(
            scope="team-a", execution_id="same", machine_name=machine.name, spec=make_spec(), actor=TEST_ACTOR
        )

    results = run_together(12, submit)
    assert all(not isinstance(result, Exception) for result in results), results
    assert len({execution.pk for execution, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    assert Execution.objects.count() == 1
    assert ExecutionEvent.objects.count() == 1


def test_twelve_different_submits_to_one_idle_machine_one_takes_the_slot():
    machine = make_machine("idle")

    def submit(index: int):
        return actions.submit_execution(
            scope="team-a", execution_id=f"job-{index}", machine_name=machine.name, spec=make_spec(), actor=TEST_ACTOR
        )

    results = run_together(12, submit)
    winners = [result for result in results if isinstance(result, tuple)]
    losers = [result for result in results if isinstance(result, Exception)]
    assert len(winners) == 1
    assert len(losers) == 11 and all(isinstance(error, SlotTaken) for error in losers)
    holder = winners[0][0]
    assert all(f"team-a/{holder.execution_id}" in str(error) for error in losers)
    assert Machine.objects.get(pk=machine.pk).active_execution_id == holder.pk
    assert Execution.objects.count() == 1  # refused submissions leave nothing behind


def test_two_operators_resolving_at_once_one_wins_one_gets_a_clear_error():
    execution = make_execution()
    execution = actions.transition(execution, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR)
    execution = actions.transition(execution, State.UNKNOWN, evidence=Evidence.CONTROLLER_LOST, actor=TEST_ACTOR)

    def read(_: int) -> Execution:
        return Execution.objects.get(pk=execution.pk)  # both operators see it unknown, before either acts

    def resolve(index: int, mine: Execution):
        assert mine.state == State.UNKNOWN
        return mark_resolved(mine, f"checked by op{index}", actor=actions.Actor(f"user:op{index}"))

    results = run_together(2, resolve, prepare=read)
    wins = [result for result in results if isinstance(result, Execution)]
    errors = [result for result in results if isinstance(result, ExecutionError)]
    assert len(wins) == 1 and len(errors) == 1, results
    # Both passed the transition table (each read unknown); only the compare-and-set can have refused one.
    assert isinstance(errors[0], TransitionRefused)
    assert str(errors[0]).endswith("is resolved; cannot move it to resolved: it changed while you were looking")
    resolved_events = ExecutionEvent.objects.filter(execution=execution, to_state=State.RESOLVED)
    assert resolved_events.count() == 1
    assert resolved_events.get().actor == wins[0].events.last().actor


# --- the database's own guard, for a write that bypasses actions.py ---------------------------


def _raw_execution(machine: Machine, execution_id: str, state: str, **fields) -> Execution:
    spec = make_spec()
    if state != State.PENDING:
        fields.setdefault("ended_at", Now())
    with transaction.atomic():
        return Execution.objects.create(
            scope="team-a",
            execution_id=execution_id,
            spec=spec.to_json(),
            spec_digest=spec.digest,
            machine=machine,
            state=state,
            **fields,
        )


def test_database_refuses_a_second_live_execution_on_one_machine():
    machine = make_machine("one-slot")
    holder = make_execution(machine, execution_id="holder")
    for state in (State.PENDING, State.DISPATCHED, State.RUNNING, State.UNKNOWN):
        with pytest.raises(IntegrityError, match="execution_one_live_per_machine"):
            _raw_execution(machine, f"raw-{state}", state)
    # Settled history on the machine, and live executions on other machines, are fine.
    old = _raw_execution(machine, "old", State.COMPLETED, evidence=Evidence.KILLED)
    _raw_execution(make_machine("other"), "elsewhere", State.PENDING)
    # Reviving a settled execution beside the live one is refused too.
    with pytest.raises(IntegrityError, match="execution_one_live_per_machine"), transaction.atomic():
        Execution.objects.filter(pk=old.pk).update(state=State.RUNNING, ended_at=None)

    # unknown still holds the slot; resolving frees it for the next submit.
    holder = actions.transition(holder, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR)
    holder = actions.transition(holder, State.UNKNOWN, evidence=Evidence.CONTROLLER_LOST, actor=TEST_ACTOR)
    with pytest.raises(IntegrityError, match="execution_one_live_per_machine"):
        _raw_execution(machine, "while-unknown", State.PENDING)
    mark_resolved(holder, "container removed")
    assert make_execution(machine, execution_id="next").state == State.PENDING


def test_six_opens_at_once_keep_to_a_cap_of_five(alice, settings):
    from terminals import actions as terminal_actions

    settings.TETHER_SESSIONS_PER_USER = 5
    settings.TETHER_HOST_SHELLS_FOR_ALL = True
    machines = [make_machine(f"cap-{n}") for n in range(6)]
    for machine in machines:
        grant(alice, machine)
    results = run_together(6, lambda n: terminal_actions.open_terminal(machines[n], alice))
    opened = [result for result in results if isinstance(result, tuple)]
    refused = [result for result in results if isinstance(result, ExecutionError)]
    assert (len(opened), len(refused)) == (5, 1), results
    assert "the limit is 5" in str(refused[0])
    from terminals.models import TerminalSession

    assert TerminalSession.objects.filter(user=alice, process_state="live").count() == 5

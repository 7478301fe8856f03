"""A close (or kill, or reset) asked by an operator or the API and the owner's own fenced transaction take the
lease's row and the session's in one order (the lease first), so they wait for each other instead of
deadlocking: a close took the session's row, then waited for the lease, which the owner held while it waited
for the session's (seen once under two concurrent schemathesis runs: `terminal_close` → `request_process_action`).
Only the close (complete) wrote the session's row first and deadlocked before (reproduced); kill and reset are
here to keep them waiting, not deadlocking, as the order changes."""

from __future__ import annotations

import threading

import pytest
from django.conf import settings

from executions.actions import Actor
from terminals import actions
from terminals.models import ProcessLease, ProcessState, TerminalSession
from tests.access.test_revoke_racing_an_open import WAITS, Side
from tests.factories import make_machine

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("action", ["complete", "kill", "reset"])
def test_an_operators_action_waits_for_the_owners_fenced_transaction_and_neither_deadlocks(operator, action):
    session, _ = actions.open_terminal(make_machine("box"), operator)
    worker = actions.register_worker(
        worker_id="w-order", host=settings.TETHER_HOST, pid=1, started_at=1, boot_id="b", channel_name="c"
    )
    _, lease = actions.claim_next_execution(worker, {"local"})
    holding, go_on = threading.Event(), threading.Event()

    def owner():
        """What an owner does when it settles: the lease fenced first, then the session's row."""
        with actions.fenced(session.execution_id, worker, lease.token):
            holding.set()
            assert go_on.wait(30)
            TerminalSession.objects.filter(pk=session.pk).update(marks_note="settling")
        return "settled"

    def operator_asks():
        actions.operator_session_action(session, action, actor=Actor.for_user(operator), reason="done")
        return "asked"

    owning = Side(owner)
    owning.start()
    assert holding.wait(30)
    asking = Side(operator_asks)
    asking.start()
    asking.join(WAITS)
    assert asking.is_alive(), f"the operator's action did not wait for the lease: {asking.error!r}"
    go_on.set()
    owning.join(30)
    asking.join(30)
    assert (owning.result, owning.error) == ("settled", None), owning.error
    assert (asking.result, asking.error) == ("asked", None), asking.error
    assert ProcessLease.objects.get(pk=lease.pk).requested_action == action
    if action == "complete":
        assert TerminalSession.objects.get(pk=session.pk).process_state == ProcessState.CLOSING

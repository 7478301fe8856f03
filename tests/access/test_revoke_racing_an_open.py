"""A revoke racing an open never yields an open after the revoke committed (access/fence.py), whatever takes the
access away: the grant revoked or lowered to watch, the person out of the group or deactivated, the label off
the machine, the token revoked. Two real transactions on PostgreSQL, each in its own thread and connection:

- the change is made and held uncommitted; an open (a shell from the portal's action, a command through the API)
  started then waits for it, and once the change commits the open is refused and nothing is created;
- an open holds its decision uncommitted; the change waits for it (it then finds the open and closes it with
  everything else it takes away, as tests/access/test_losing_access.py shows).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager

import pytest
from django.contrib.auth.models import Group, Permission
from django.db import connections, transaction
from django.test import Client

from access import actions as access_actions
from access.fence import decided_again
from access.policy import Do
from api.models import ApiToken
from api.tokens import create_token, revoke_token
from executions.actions import Actor, set_labels
from executions.errors import Refused
from executions.models import Backend, Execution, Machine
from terminals import actions
from terminals.models import TerminalSession
from tests.factories import TEST_ACTOR, grant, make_machine

pytestmark = pytest.mark.django_db(transaction=True)

WAITS = 0.6  # how long an act must stay blocked to count as waiting (it answers in milliseconds otherwise)


class Side(threading.Thread):
    """``work`` in a thread of its own (its own connection); the result or the error kept."""

    def __init__(self, work: Callable[[], object]):
        super().__init__(daemon=True)
        self.work, self.result, self.error = work, None, None

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as error:
            self.error = error
        finally:
            connections.close_all()


@contextmanager
def held(change: Callable[[], object]):
    """``change`` made in its own transaction, held uncommitted until the block ends, then committed."""
    made, commit = threading.Event(), threading.Event()

    def work():
        with transaction.atomic():
            change()
            made.set()
            assert commit.wait(30), "the test never let the change commit"

    side = Side(work)
    side.start()
    assert made.wait(30), f"the change was not made: {side.error!r}"
    try:
        yield side
    finally:
        commit.set()
        side.join(30)
    assert not side.is_alive() and side.error is None, f"the change failed: {side.error!r}"


@pytest.fixture
def world(alice):
    """alice may use a docker machine through each way a grant reaches her; each case takes one away."""
    team = Group.objects.create(name="payments")
    alice.groups.add(team)
    machine = make_machine("pay-1", backend=Backend.DOCKER)
    set_labels(machine, {"team": "payments"}, actor=TEST_ACTOR)
    return alice, team, machine


def _change(case: str, alice, team, machine) -> Callable[[], object]:
    """Give alice ``use`` through the way ``case`` takes away; returns what takes it away."""
    staff = Actor.command("tests")
    if case == "grant revoked":
        grant(alice, machine, "use")
        return lambda: access_actions.revoke(actor=staff, user=alice, machine=machine)
    if case == "lowered to watch":
        grant(alice, machine, "use")
        return lambda: access_actions.grant(role="watch", actor=staff, user=alice, machine=machine)
    if case == "out of the group":
        grant(team, machine, "use")
        return lambda: alice.groups.remove(team)
    if case == "deactivated":
        grant(alice, machine, "use")

        def deactivate():  # on its own copy, as the admin's request would
            hers = type(alice).objects.get(pk=alice.pk)
            hers.is_active = False
            hers.save()

        return deactivate
    if case == "label taken off":
        grant(team, "team=payments", "use")
        return lambda: set_labels(Machine.objects.get(pk=machine.pk), {}, actor=staff)  # its own copy
    if case in ("permission taken away", "group's permission taken away", "no longer staff"):
        # Staff with access.use_every_workspace reach a machine no grant names: a person's, or a group's.
        every = Permission.objects.get(codename="use_every_workspace", content_type__app_label="access")
        type(alice).objects.filter(pk=alice.pk).update(is_staff=True)
        alice.is_staff = True  # the open's own copy, as the portal's request would load it
        if case == "group's permission taken away":
            team.permissions.add(every)
            return lambda: Group.objects.get(pk=team.pk).permissions.remove(every)
        alice.user_permissions.add(every)
        if case == "permission taken away":
            return lambda: type(alice).objects.get(pk=alice.pk).user_permissions.remove(every)

        def demote():
            hers = type(alice).objects.get(pk=alice.pk)
            hers.is_staff = False
            hers.save()

        return demote
    raise AssertionError(case)


CASES = [
    "grant revoked", "lowered to watch", "out of the group", "deactivated", "label taken off",
    "permission taken away", "group's permission taken away", "no longer staff",
]  # fmt: skip


def _open(alice, machine):
    def work():
        try:
            return actions.open_terminal(machine, alice)
        except Refused as refused:
            return refused

    return work


@pytest.mark.parametrize("case", CASES)
def test_an_open_started_while_the_change_is_uncommitted_waits_and_is_refused(world, case):
    alice, team, machine = world
    change = _change(case, alice, team, machine)
    with held(change):
        opening = Side(_open(alice, machine))
        opening.start()
        opening.join(WAITS)
        assert opening.is_alive(), f"the open did not wait for the change: {opening.result or opening.error!r}"
    opening.join(30)
    assert opening.error is None, repr(opening.error)
    assert isinstance(opening.result, Refused), f"opened after the change committed: {opening.result!r}"
    assert str(opening.result) == "you may not open a shell on pay-1"
    assert not TerminalSession.objects.exists() and not Execution.objects.exists()


@pytest.mark.parametrize("case", CASES)
def test_the_change_waits_for_an_open_deciding_now(world, case):
    """The other order: the open's decision stands uncommitted; the change commits only after it."""
    alice, team, machine = world
    change = _change(case, alice, team, machine)
    decided, done = threading.Event(), threading.Event()

    def open_and_hold():
        with transaction.atomic():
            allowed = decided_again(alice, Do.USE, machine)
            decided.set()
            assert done.wait(30)
            return allowed

    opening = Side(open_and_hold)
    opening.start()
    assert decided.wait(30)
    changing = Side(lambda: transaction.atomic()(change)())
    changing.start()
    changing.join(WAITS)
    assert changing.is_alive(), f"the change did not wait for the open deciding now: {changing.error!r}"
    done.set()
    opening.join(30)
    changing.join(30)
    assert opening.result is True and changing.error is None, (opening.result, changing.error)


def _called_while(change: Callable[[], object], raw: str, path: str, body: dict) -> tuple[int, dict]:
    """An API call made while ``change`` is held uncommitted: it must wait for it. Its answer once it commits."""

    def call():
        answer = Client().post(path, body, content_type="application/json", headers={"Authorization": f"Bearer {raw}"})
        return answer.status_code, answer.json()

    with held(change):
        calling = Side(call)
        calling.start()
        calling.join(WAITS)
        assert calling.is_alive(), f"the call did not wait: {calling.result or calling.error!r}"
    calling.join(30)
    assert calling.error is None, repr(calling.error)
    return calling.result


SUBMIT = {"scope": "ci", "id": "race-1", "machine": "pay-1", "argv": ["true"]}


def test_a_command_submitted_while_its_token_is_being_revoked_waits_and_is_refused(world):
    alice, _, machine = world
    grant(alice, machine, "use")
    token, raw = create_token(alice, name="agent", scopes=["run"])
    revoking = lambda: revoke_token(token.pk, by=alice, reason="leaked")  # noqa: E731
    status, body = _called_while(revoking, raw, "/api/v1/executions", SUBMIT)
    assert (status, body["code"]) == (404, "not_found"), body
    assert not Execution.objects.exists()
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None


def test_a_command_submitted_while_the_grant_is_being_revoked_waits_and_is_refused(world):
    alice, _, machine = world
    grant(alice, machine, "use")
    _, raw = create_token(alice, name="agent", scopes=["run"])
    revoking = lambda: access_actions.revoke(actor=Actor.command("tests"), user=alice, machine=machine)  # noqa: E731
    status, body = _called_while(revoking, raw, "/api/v1/executions", SUBMIT)
    assert (status, body["code"]) == (404, "not_found"), body
    assert not Execution.objects.exists()


def test_a_shell_opened_through_the_api_while_its_token_is_being_revoked_waits_and_is_refused(world):
    """The API's open decides again as the token (narrowed, not revoked), not only as its person."""
    alice, _, machine = world
    grant(alice, machine, "use")
    token, raw = create_token(alice, name="agent", scopes=["terminals"])
    revoking = lambda: revoke_token(token.pk, by=alice, reason="leaked")  # noqa: E731
    status, body = _called_while(revoking, raw, "/api/v1/terminals", {"machine": "pay-1"})
    assert (status, body["code"]) == (404, "not_found"), body
    assert not TerminalSession.objects.exists()

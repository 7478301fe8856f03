"""What names an execution and how long a closed shell answers: aliases given by the API and by exec_submit,
and a closed terminal session's identity and output kept for TETHER_RETENTION_HOURS, then 410."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db.models.functions import Now
from django.test import Client

from api.tokens import create_token
from executions.actions import Actor, cancel_execution
from executions.actions.machines import add_machine
from executions.models import ALIASED, Execution, ExecutionAlias, ExecutionEvent
from terminals import actions
from terminals.models import CloseReason, TerminalSession
from tests.factories import TEST_ACTOR, grant

pytestmark = pytest.mark.django_db


def api(method: str, path: str, token: str, body: dict | None = None, **query):
    client, auth = Client(), {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if method == "GET":
        return client.get(f"/api/v1{path}", query or None, **auth)
    return client.generic(method, f"/api/v1{path}", json.dumps(body or {}), "application/json", **auth)


@pytest.fixture
def box(alice, bob):
    """A docker workspace both may use (no container: nothing here is started)."""
    machine = add_machine(name="names-box", backend="docker", ref="some-container", actor=Actor.command("t"))
    grant(alice, machine)
    grant(bob, machine)
    return machine


def ended(pk: int) -> None:
    """Cancelled before it ran: the machine's slot is free for the next submission."""
    cancel_execution(Execution.objects.get(pk=pk), actor=TEST_ACTOR)


def token(user, *scopes: str) -> str:
    return create_token(user, name="names", scopes=list(scopes or ("read", "run", "terminals")))[1]


def submit(raw: str, box, id: str, **more):
    spec = {"scope": "ci", "id": id, "machine": box.name, "argv": ["true"], **more}
    return api("POST", "/executions", raw, spec)


def test_aliases_name_one_execution_found_by_any_and_listed_once(box, alice):
    raw = token(alice)
    first = submit(raw, box, "build-7", aliases=[{"scope": "ci", "id": "run-1"}, {"scope": "deploy", "id": "d-9"}])
    assert first.status_code == 201, first.content
    execution = first.json()["execution"]
    assert execution["aliases"] == [{"scope": "ci", "id": "run-1"}, {"scope": "deploy", "id": "d-9"}]
    pk = execution["id"]

    for scope, id in (("ci", "build-7"), ("ci", "run-1"), ("deploy", "d-9")):
        found = api("GET", "/executions/lookup", raw, scope=scope, id=id)
        assert (found.status_code, found.json()["id"]) == (200, pk), (scope, id, found.content)
    # A submission under an alias is the same submission: nothing new runs.
    again = submit(raw, box, "run-1")
    assert (again.status_code, again.json()["created"], again.json()["execution"]["id"]) == (200, False, pk)
    # Listed once in its own scope (named twice there), and in the alias's scope.
    assert [e["id"] for e in api("GET", "/executions", raw, scope="ci").json()] == [pk]
    assert [e["id"] for e in api("GET", "/executions", raw, scope="deploy").json()] == [pk]

    # Added later: 201, then 200 for the same again; each new one an audit event.
    added = api("POST", f"/executions/{pk}/aliases", raw, {"scope": "ci", "id": "run-1-retry"})
    assert added.status_code == 201, added.content
    assert {"scope": "ci", "id": "run-1-retry"} in added.json()["aliases"]
    assert api("POST", f"/executions/{pk}/aliases", raw, {"scope": "ci", "id": "run-1-retry"}).status_code == 200
    assert api("POST", f"/executions/{pk}/aliases", raw, {"scope": "ci", "id": "build-7"}).status_code == 200
    events = ExecutionEvent.objects.filter(execution_id=pk, evidence=ALIASED)
    assert sorted(e.detail["alias"] for e in events) == ["d-9", "run-1", "run-1-retry"]
    assert {e.actor for e in events} == {"user:alice token:names"}


def test_an_alias_naming_another_execution_is_a_409_and_nothing_of_the_submission_stands(box, alice):
    raw = token(alice)
    one = submit(raw, box, "one").json()["execution"]["id"]
    api("POST", f"/executions/{one}/aliases", raw, {"scope": "ci", "id": "shared-name"})
    ended(one)

    refused = submit(raw, box, "two", aliases=[{"scope": "ci", "id": "shared-name"}])
    assert refused.status_code == 409 and refused["Content-Type"] == "application/problem+json"
    assert refused.json()["code"] == "identity_conflict"
    assert not Execution.objects.filter(execution_id="two").exists()  # the whole submission refused
    # Its own id as an alias of another, and an alias of the first given to another: refused the same way.
    two = submit(raw, box, "two").json()["execution"]["id"]
    for alias in ({"scope": "ci", "id": "one"}, {"scope": "ci", "id": "shared-name"}):
        answer = api("POST", f"/executions/{two}/aliases", raw, alias)
        assert (answer.status_code, answer.json()["code"]) == (409, "identity_conflict"), alias
    # A submission under an alias is refused as for its own id when the spec differs.
    other_spec = submit(raw, box, "shared-name", argv=["false"])
    assert (other_spec.status_code, other_spec.json()["code"]) == (409, "identity_conflict")


def test_aliases_are_each_persons_own(box, alice, bob):
    """bob may give the ids alice's aliases use: a namespace each, and no answer says hers exists."""
    alices, bobs = token(alice), token(bob)
    pk = submit(alices, box, "hers", aliases=[{"scope": "ci", "id": "nightly"}]).json()["execution"]["id"]
    assert api("GET", "/executions/lookup", bobs, scope="ci", id="nightly").status_code == 404
    assert api("POST", f"/executions/{pk}/aliases", bobs, {"scope": "ci", "id": "mine"}).status_code == 404
    assert api("GET", "/executions", bobs, scope="ci").json() == []
    ended(pk)
    his = submit(bobs, box, "nightly")  # his own id, the same as her alias
    assert his.status_code == 201, his.content
    assert api("GET", "/executions/lookup", alices, scope="ci", id="nightly").json()["id"] == pk


def test_bad_aliases_are_refused_with_the_field_named(box, alice):
    raw = token(alice)
    for aliases, word in (
        ([{"scope": "ci", "id": "bad id"}], "aliases"),
        ([{"scope": "ci"}], "aliases"),
        ([{"scope": "ci", "id": "x", "extra": 1}], "extra"),
        ([{"scope": "ci", "id": f"a{i}"} for i in range(21)], "aliases"),
    ):
        answer = submit(raw, box, "bad-aliases", aliases=aliases)
        assert answer.status_code in (400, 422) and word in answer.json()["detail"], (aliases, answer.content)
    assert not Execution.objects.filter(execution_id="bad-aliases").exists()


def test_exec_submit_takes_aliases_and_refuses_one_naming_another(box, capsys):
    call_command("exec_submit", "--scope", "ops", "--id", "a", "--machine", box.name, "--alias", "ops/a-too",
                 "--json", "true")  # fmt: skip
    made = json.loads(capsys.readouterr().out)
    assert made["aliases"] == [{"scope": "ops", "id": "a-too"}]
    assert ExecutionAlias.objects.filter(namespace="", scope="ops", alias_id="a-too").count() == 1
    ended(Execution.objects.get(execution_id="a").pk)
    with pytest.raises(Exception, match="already names another execution"):
        call_command("exec_submit", "--scope", "ops", "--id", "b", "--machine", box.name, "--alias", "ops/a-too",
                     "true")  # fmt: skip
    assert not Execution.objects.filter(execution_id="b").exists()


@pytest.mark.django_db(transaction=True)  # its output read is an async view: its own connection
def test_a_closed_session_answers_for_its_retention_then_410_with_when_it_was_removed(box, alice, settings):
    raw = token(alice, "terminals")
    session, _ = actions.open_terminal(box, alice)
    actions.close_session(
        session, reason=CloseReason.EXITED, actor=TEST_ACTOR, snapshot=b"the last screen", output_offset=1000
    )
    state = api("GET", f"/terminals/{session.pk}", raw)
    assert (state.status_code, state.json()["process_state"]) == (200, "closed")
    tail = api("GET", f"/terminals/{session.pk}/output", raw, since=0).json()
    assert (tail["text"], tail["offset"], tail["lost"], tail["end"]) == ("the last screen", 985, 985, 1000)
    assert [s["id"] for s in api("GET", "/terminals", raw).json()] == [str(session.pk)]

    # The clock moved forward past the retention (24 h by default): before the cleanup has run, and after.
    moved = TerminalSession.objects.filter(pk=session.pk)
    moved.update(closed_at=Now() - timedelta(hours=settings.TETHER_RETENTION_HOURS, minutes=1))
    closed_at = moved.get().closed_at
    for ran_cleanup in (False, True):
        if ran_cleanup:
            call_command("cleanup_terminals")
        removed = moved.get().expired_at or closed_at + timedelta(hours=settings.TETHER_RETENTION_HOURS)
        for path in (f"/terminals/{session.pk}", f"/terminals/{session.pk}/output"):
            gone = api("GET", path, raw)
            assert gone.status_code == 410 and gone["Content-Type"] == "application/problem+json", gone.content
            body = gone.json()
            assert (body["code"], body["removed_at"], body["closed_at"]) == (
                "gone",
                removed.isoformat(),
                closed_at.isoformat(),
            ), body
        assert api("GET", "/terminals", raw).json() == []
    # Still another person's answer to nobody: bob's token gets 404, not 410.
    assert api("GET", f"/terminals/{session.pk}", token(alice.__class__.objects.get(username="bob"))).status_code == 404

    # A fresh shell in the same session (the page's auto-reset), closed in its turn: kept again for its retention.
    cancel_execution(Execution.objects.get(pk=moved.get().execution_id), actor=TEST_ACTOR)  # its slot freed
    again = actions.start_next_generation(moved.get(), TEST_ACTOR, "a fresh shell")
    actions.close_session(again, reason=CloseReason.EXITED, actor=TEST_ACTOR, snapshot=b"second", output_offset=6)
    state = api("GET", f"/terminals/{session.pk}", raw)
    assert (state.status_code, state.json()["generation"]) == (200, 2), state.content
    assert api("GET", f"/terminals/{session.pk}/output", raw, since=0).json()["text"] == "second"


@pytest.mark.django_db(transaction=True)
def test_two_producers_naming_each_others_ids_at_once_get_one_execution_and_a_conflict_never_a_deadlock(alice):
    """A submits ci/run-N aliased gh/N on one machine while B submits gh/N aliased ci/run-N on another: each took
    its own id's lock, then waited for the other's (a deadlock: a 500). The identities are claimed in one order:
    one is made, the other is told its ids name another execution. Five rounds."""
    import threading

    from django.db import connections

    raw = token(alice)
    for round in range(5):
        machines = [add_machine(name=f"race-{side}-{round}", backend="docker", ref="c", actor=Actor.command("t"))
                    for side in "ab"]  # fmt: skip
        for machine in machines:
            grant(alice, machine)
        bodies = [
            {"scope": "ci", "id": f"run-{round}", "aliases": [{"scope": "gh", "id": str(round)}]},
            {"scope": "gh", "id": str(round), "aliases": [{"scope": "ci", "id": f"run-{round}"}]},
        ]
        answers, start = [None, None], threading.Barrier(2)

        def submit_one(index, bodies=bodies, answers=answers, start=start, machines=machines):
            try:
                start.wait(10)
                body = {**bodies[index], "machine": machines[index].name, "argv": ["true"]}
                answers[index] = api("POST", "/executions", raw, body)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=submit_one, args=(index,)) for index in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        said = sorted((answer.status_code, answer.json().get("code")) for answer in answers)
        assert said == [(201, None), (409, "identity_conflict")], [a.content[:300] for a in answers]
        assert Execution.objects.filter(machine__in=machines).count() == 1

"""The admin shows state read-only and changes it only through actions."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from django.db.models.signals import post_init
from django.urls import reverse

from executions import actions
from executions.models import Execution, Machine, MachineEvent, State
from tests.factories import TEST_ACTOR, make_execution, make_machine

pytestmark = pytest.mark.django_db


def test_execution_list_filters_and_searches(client, admin_user):
    client.force_login(admin_user)
    machine = make_machine("alpha")
    make_execution(machine, execution_id="deploy-42")
    page = client.get(reverse("admin:executions_execution_changelist"), {"q": "deploy-42", "state__exact": "pending"})
    assert page.status_code == 200
    assert "deploy-42" in page.text
    assert ">pending</span>" in page.text  # the state badge
    empty = client.get(reverse("admin:executions_execution_changelist"), {"state__exact": "running"})
    assert "deploy-42" not in empty.text


def test_execution_change_page_shows_events_and_has_no_editable_state(client, admin_user):
    client.force_login(admin_user)
    execution = make_execution(execution_id="job-7")
    page = client.get(reverse("admin:executions_execution_change", args=[execution.pk]))
    assert page.status_code == 200
    assert 'name="state"' not in page.text
    assert "submitted" in page.text  # the inline event
    # A forged POST cannot move the state either.
    client.post(reverse("admin:executions_execution_change", args=[execution.pk]), {"state": "completed"})
    assert Execution.objects.get(pk=execution.pk).state == State.PENDING


def test_executions_cannot_be_added_or_deleted_in_admin(client, admin_user):
    client.force_login(admin_user)
    execution = make_execution()
    assert client.get(reverse("admin:executions_execution_add")).status_code == 403
    assert (
        client.post(reverse("admin:executions_execution_delete", args=[execution.pk]), {"post": "yes"}).status_code
        == 403
    )
    assert Execution.objects.filter(pk=execution.pk).exists()


def test_adding_a_machine_in_admin_goes_through_actions(client, admin_user):
    client.force_login(admin_user)
    response = client.post(
        reverse("admin:executions_machine_add"),
        {
            "name": "web-1",
            "backend": "local",
            "ref": "",
            "engine": "",
            "scope": "team-a",
            "events-TOTAL_FORMS": "0",
            "events-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 302, response.text[:2000]
    machine = Machine.objects.get(name="web-1")
    assert MachineEvent.objects.filter(machine=machine, actor="user:admin").count() == 1


def test_admin_stop_action_is_refused_while_the_slot_is_held(client, admin_user):
    client.force_login(admin_user)
    machine = make_machine("held")
    make_execution(machine, execution_id="holder")
    free = make_machine("free")
    response = client.post(
        reverse("admin:executions_machine_changelist"),
        {"action": "stop_machines", "_selected_action": [machine.pk, free.pk]},
        follow=True,
    )
    assert "held by team-a/holder (pending)" in response.text
    assert Machine.objects.get(pk=machine.pk).state == "running"
    assert Machine.objects.get(pk=free.pk).state == "stopped"


def test_admin_cancel_action_cancels_pending_only(client, admin_user):
    client.force_login(admin_user)
    pending = make_execution()
    running = make_execution()
    running = actions.transition(running, State.DISPATCHED, evidence="claimed", actor=TEST_ACTOR)
    client.post(
        reverse("admin:executions_execution_changelist"),
        {"action": "cancel_pending", "_selected_action": [pending.pk, running.pk]},
    )
    assert Execution.objects.get(pk=pending.pk).state == State.CANCELLED
    assert Execution.objects.get(pk=running.pk).state == State.DISPATCHED


@contextmanager
def worker_moves_it_when_the_admin_reads(execution: Execution, to_state: str):
    """The first time anything loads ``execution`` from the database, a worker moves it to ``to_state`` (a real
    compare-and-set with its event): a worker's transition landing between the admin's read at request start
    and whatever the admin does at the end of the request. Yields a list that holds True once it happened."""
    fired: list[bool] = []

    def move(sender, instance, **kwargs):
        if fired or instance.pk != execution.pk:
            return
        fired.append(True)
        fresh = Execution.objects.get(pk=execution.pk)
        actions.transition(fresh, to_state, evidence="claimed", actor=actions.Actor("worker:w1"))

    post_init.connect(move, sender=Execution, weak=False)
    try:
        yield fired
    finally:
        post_init.disconnect(move, sender=Execution)


def test_saving_a_valid_execution_change_form_never_reverts_a_worker_transition(client, admin_user):
    client.force_login(admin_user)
    execution = make_execution(execution_id="job-8")
    url = reverse("admin:executions_execution_change", args=[execution.pk])
    submitted = execution.events.get()
    # A valid form: the inline's management fields included, so the admin gets as far as saving.
    form = {"events-TOTAL_FORMS": "1", "events-INITIAL_FORMS": "1", "events-0-id": str(submitted.pk)}
    with worker_moves_it_when_the_admin_reads(execution, State.DISPATCHED) as fired:
        response = client.post(url, form)
    assert fired, "the worker's transition did not happen during the request"
    assert response.status_code == 302, response.text[:2000]
    execution.refresh_from_db()
    assert (execution.state, execution.evidence) == (State.DISPATCHED, "claimed")
    assert execution.dispatched_at is not None
    # The worker's event is the only one written; the admin wrote none.
    assert list(execution.events.values_list("to_state", "actor")) == [
        (State.PENDING, "command:tests"),
        (State.DISPATCHED, "worker:w1"),
    ]


def test_execution_change_page_has_no_save_buttons(client, admin_user):
    client.force_login(admin_user)
    execution = make_execution()
    page = client.get(reverse("admin:executions_execution_change", args=[execution.pk]))
    assert page.status_code == 200
    assert 'name="_save"' not in page.text
    assert 'name="_continue"' not in page.text
    assert 'name="_addanother"' not in page.text


def test_saving_the_machine_change_form_changes_nothing(client, admin_user):
    client.force_login(admin_user)
    machine = make_machine("steady")
    holder = make_execution(machine, execution_id="holder")
    url = reverse("admin:executions_machine_change", args=[machine.pk])
    assert 'name="_save"' not in client.get(url).text
    response = client.post(
        url,
        {
            "name": "renamed",
            "backend": "docker",
            "ref": "other",
            "scope": "team-b",
            "state": "stopped",
            "incarnation": "9",
            "active_execution": "",
            "events-TOTAL_FORMS": "1",
            "events-INITIAL_FORMS": "1",
            "events-0-id": str(machine.events.get().pk),
        },
    )
    assert response.status_code == 302, response.text[:2000]
    after = Machine.objects.get(pk=machine.pk)
    assert (after.name, after.backend, after.ref, after.scope, after.state, after.incarnation) == (
        "steady",
        "local",
        "",
        "team-a",
        "running",
        1,
    )
    assert after.active_execution_id == holder.pk
    assert after.events.count() == 1


def test_execution_list_filters_by_kind_and_machine(client, admin_user):
    client.force_login(admin_user)
    alpha, beta = make_machine("alpha"), make_machine("beta")
    make_execution(alpha, execution_id="cmd-on-alpha")
    make_execution(beta, execution_id="term-on-beta", kind="terminal")
    changelist = reverse("admin:executions_execution_changelist")
    terminals = client.get(changelist, {"kind__exact": "terminal"}).text
    assert "term-on-beta" in terminals and "cmd-on-alpha" not in terminals
    commands = client.get(changelist, {"kind__exact": "command"}).text
    assert "cmd-on-alpha" in commands and "term-on-beta" not in commands
    on_alpha = client.get(changelist, {"machine__id__exact": alpha.pk}).text
    assert "cmd-on-alpha" in on_alpha and "term-on-beta" not in on_alpha


def test_execution_list_searches_by_scope(client, admin_user):
    client.force_login(admin_user)
    make_execution(scope="payments", execution_id="nightly")
    make_execution(scope="search-team", execution_id="reindex")
    page = client.get(reverse("admin:executions_execution_changelist"), {"q": "payments"})
    assert page.status_code == 200
    assert "payments/nightly" in page.text and "reindex" not in page.text


def test_an_execution_whose_aliases_both_match_a_search_is_listed_once(client, admin_user):
    client.force_login(admin_user)
    execution = make_execution(execution_id="build-7")
    actions.add_alias(execution, "team-a", "ci-run-1")
    actions.add_alias(execution, "team-a", "ci-run-1-retry")
    make_execution(execution_id="unrelated")
    # "ci-run-1" matches neither scope nor id, only both aliases: a join that yields the row twice.
    page = client.get(reverse("admin:executions_execution_changelist"), {"q": "ci-run-1"})
    assert page.status_code == 200
    assert [row.pk for row in page.context["cl"].result_list] == [execution.pk]
    assert page.context["cl"].result_count == 1
    assert page.text.count('name="_selected_action"') == 1  # one row on the page, too


def test_adding_a_machine_in_admin_shows_a_bad_engine_or_missing_ref_on_the_form(client, admin_user):
    client.force_login(admin_user)
    form = {
        "name": "web-2",
        "backend": "local",
        "ref": "",
        "engine": "tcp://docker.example:2376",
        "scope": "team-a",
        "events-TOTAL_FORMS": "0",
        "events-INITIAL_FORMS": "0",
    }
    response = client.post(reverse("admin:executions_machine_add"), form)
    assert response.status_code == 200  # the form again, with the error beside the field
    assert "an engine URL is only for docker machines, not local" in response.text
    response = client.post(reverse("admin:executions_machine_add"), {**form, "backend": "docker", "ref": ""})
    assert response.status_code == 200
    assert "a docker machine needs the container id or name" in response.text
    assert not Machine.objects.exists()


def test_admin_start_action_starts_stopped_machines_through_actions(client, admin_user):
    client.force_login(admin_user)
    machine = actions.set_machine_state(make_machine("sleepy"), "stopped", actor=TEST_ACTOR)
    running = make_machine("awake")
    response = client.post(
        reverse("admin:executions_machine_changelist"),
        {"action": "start_machines", "_selected_action": [machine.pk, running.pk]},
        follow=True,
    )
    assert "Started: 1" in response.text
    assert "machine awake is running; cannot move it to running" in response.text
    assert Machine.objects.get(pk=machine.pk).state == "running"
    started = MachineEvent.objects.filter(machine=machine).last()
    assert (started.from_state, started.to_state, started.actor) == ("stopped", "running", "user:admin")
    assert MachineEvent.objects.filter(machine=running).count() == 1


def test_inline_events_cannot_be_changed_from_the_change_form(client, admin_user):
    client.force_login(admin_user)
    execution = make_execution()
    event = execution.events.get()
    url = reverse("admin:executions_execution_change", args=[execution.pk])
    page = client.get(url)
    assert 'name="events-0-reason"' not in page.text and 'name="events-0-to_state"' not in page.text
    client.post(
        url,
        {
            "events-TOTAL_FORMS": "2",
            "events-INITIAL_FORMS": "1",
            "events-0-id": str(event.pk),
            "events-0-reason": "rewritten",
            "events-0-to_state": "completed",
            "events-0-DELETE": "on",
            "events-1-to_state": "completed",
            "events-1-reason": "forged",
        },
    )
    assert list(execution.events.values_list("pk", "to_state", "reason")) == [(event.pk, "pending", "")]

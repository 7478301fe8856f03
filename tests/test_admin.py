"""The admin shows state read-only and changes it only through actions."""

from __future__ import annotations

import pytest
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

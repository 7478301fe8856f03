"""The admin's recovery console through Django's test client: who may see and do what, a drain as a guarded
transition (two operators at once, one winner), and the pages' contents from the record."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from executions.models import State
from terminals import actions
from terminals.models import WorkerEvent, WorkerState
from tests.factories import make_execution
from tests.test_views import logged_in

pytestmark = pytest.mark.django_db(transaction=True)  # the recovery page looks with its own connections


def staff(django_user_model, name: str, *codenames: str):
    user = django_user_model.objects.create_user(name, is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


def test_each_page_and_action_needs_its_own_permission(django_user_model, dead_worker):
    looker = logged_in(staff(django_user_model, "looker", "view_worker"))
    changelist = looker.get("/admin/terminals/worker/")
    assert changelist.status_code == 200 and b"drain_workers" not in changelist.content
    recovery = looker.get("/admin/terminals/worker/recovery/")
    assert recovery.status_code == 200 and b"Run recovery" not in recovery.content
    assert b"needs the permission" in recovery.content
    assert looker.post("/admin/terminals/worker/recovery/", {"confirm": "yes"}).status_code == 403
    assert looker.get("/admin/terminals/worker/unknowns/").status_code == 403  # needs to see executions
    nobody = logged_in(staff(django_user_model, "nobody"))
    for path in (
        "/admin/terminals/worker/",
        "/admin/terminals/worker/recovery/",
        f"/admin/terminals/worker/{dead_worker.pk}/drain/",
    ):
        assert nobody.get(path).status_code == 403, path


def test_a_drain_is_confirmed_with_a_reason_and_two_operators_get_one_winner(django_user_model, dead_worker):
    operators = [logged_in(staff(django_user_model, f"ops{n}", "view_worker", "drain_worker")) for n in (1, 2)]
    action = {"action": "drain_workers", "_selected_action": [dead_worker.pk]}
    asked = operators[0].post("/admin/terminals/worker/", action)
    assert b"Drain these workers?" in asked.content and b'name="reason"' in asked.content
    assert operators[0].post("/admin/terminals/worker/", {**action, "post": "yes"}).status_code == 200  # no reason
    dead_worker.refresh_from_db()
    assert dead_worker.state == WorkerState.RUNNING
    done = operators[0].post("/admin/terminals/worker/", {**action, "post": "yes", "reason": "host maintenance"})
    assert done.status_code == 302 and done["Location"].endswith(f"/worker/{dead_worker.pk}/drain/")
    late = operators[1].post("/admin/terminals/worker/", {**action, "post": "yes", "reason": "me too"}, follow=True)
    assert b"is draining; cannot move it to draining" in late.content  # told, and nothing written
    events = WorkerEvent.objects.filter(worker=dead_worker, to_state=WorkerState.DRAINING)
    assert [(e.user.username, e.reason) for e in events] == [("ops1", "host maintenance")]
    page = operators[0].get(f"/admin/terminals/worker/{dead_worker.pk}/drain/")
    assert b'hx-trigger="every 1s"' in page.content  # not stopped yet: the page refreshes itself


def test_the_workers_list_says_which_worker_is_presumed_dead(django_user_model, dead_worker):
    from datetime import timedelta

    from django.utils import timezone

    from terminals.models import Worker

    Worker.objects.filter(pk=dead_worker.pk).update(heartbeat_at=timezone.now() - timedelta(minutes=5))
    page = logged_in(staff(django_user_model, "looker", "view_worker")).get("/admin/terminals/worker/")
    assert b"presumed dead" in page.content


def test_the_unknowns_queue_lists_each_unknown_oldest_first(django_user_model, dead_worker):
    execution = make_execution(execution_id="lost-1")
    claimed, lease = actions.claim_next_execution(dead_worker, {"local"})
    actions.fenced_transition(claimed, State.UNKNOWN, worker=dead_worker, token=lease.token, evidence="controller_lost")
    viewer = logged_in(staff(django_user_model, "viewer", "view_execution"))
    page = viewer.get("/admin/terminals/worker/unknowns/")
    assert page.status_code == 200 and execution.execution_id.encode() in page.content
    assert b'class="check-owner"' in page.content and b"Check and resolve" not in page.content  # not theirs to do

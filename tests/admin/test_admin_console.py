"""The admin's recovery console through Django's test client: who may see and do what, a drain as a guarded
transition (two operators at once, one winner), and the pages' contents from the record."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from executions.models import State
from terminals import actions
from terminals.models import WorkerEvent, WorkerState
from tests.factories import make_execution
from tests.terminals.test_views import logged_in

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


def test_a_silent_worker_is_not_drained_recovery_takes_its_leases(django_user_model, dead_worker):
    """A worker silent past the TTL would never act on a drain (its page would refresh forever): refused, and
    the operator is told what takes over instead."""
    from datetime import timedelta

    from django.utils import timezone

    from executions.actions import Actor
    from executions.errors import TransitionRefused
    from terminals.models import Worker

    Worker.objects.filter(pk=dead_worker.pk).update(heartbeat_at=timezone.now() - timedelta(minutes=5))
    with pytest.raises(TransitionRefused, match=r"presumed dead.*taken over by recovery"):
        actions.drain_worker(dead_worker.worker_id, actor=Actor.command("test"))
    ops = logged_in(staff(django_user_model, "ops", "view_worker", "drain_worker"))
    action = {"action": "drain_workers", "_selected_action": [dead_worker.pk], "post": "yes", "reason": "r"}
    answer = ops.post("/admin/terminals/worker/", action, follow=True)
    assert b"would never act on a drain" in answer.content
    assert not WorkerEvent.objects.filter(worker=dead_worker, to_state=WorkerState.DRAINING).exists()
    page = ops.get(f"/admin/terminals/worker/{dead_worker.pk}/drain/")
    assert b"hx-trigger" not in page.content and b"No drain was asked" in page.content  # nothing to watch


def test_the_drain_page_watches_until_what_the_worker_left_is_adopted(django_user_model, dead_worker):
    """Stopped is not the end of a drain: the page keeps refreshing until each shell it left is adopted."""
    import os

    from executions.actions import Actor, record_fact
    from terminals.backends.procfs import ProcessIdentity, boot_id
    from terminals.models import ProcessLease

    make_execution(execution_id="held-1")
    claimed, lease = actions.claim_next_execution(dead_worker, {"local"})
    actions.drain_worker(dead_worker.worker_id, actor=Actor.command("test"), reason="maintenance")
    actions.stop_worker(dead_worker, "drained")
    me = ProcessIdentity.of(os.getpid())
    adopter = actions.register_worker(worker_id="adopter-" + "0" * 24, host=dead_worker.host, pid=me.pid,
                                      started_at=me.start_time, boot_id=boot_id(), channel_name="")  # fmt: skip
    ops = logged_in(staff(django_user_model, "ops", "view_worker"))
    path = f"/admin/terminals/worker/{dead_worker.pk}/drain/"
    page = ops.get(path)
    assert b"Left for adoption (1)" in page.content and b'hx-trigger="every 1s"' in page.content

    ProcessLease.objects.filter(pk=lease.pk).update(worker=adopter)  # taken over; not yet attached
    page = ops.get(path)
    assert b"Left for adoption (0)" in page.content and b"1 taken over by another worker" in page.content
    assert b'hx-trigger="every 1s"' in page.content

    detail = {"token": lease.token + 1, "previous_worker": dead_worker.worker_id}
    record_fact(claimed, actor=Actor.worker(adopter.worker_id), reason="adopted", evidence="adopted", detail=detail)
    page = ops.get(path)
    assert b"every shell it left has been adopted" in page.content and b"hx-trigger" not in page.content


def test_the_queue_names_the_worker_that_watched_it_not_the_one_that_recorded_it(django_user_model, dead_worker):
    """The owner check judges the worker that last watched the process; the queue's Drain link is that one's,
    never the healthy worker whose recovery pass recorded the outcome unknown."""
    import os

    from terminals import console
    from terminals.backends.procfs import ProcessIdentity, boot_id

    me = ProcessIdentity.of(os.getpid())  # alive: a frozen owner that must be drained first
    frozen = actions.register_worker(worker_id="frozen-" + "0" * 25, host=dead_worker.host, pid=me.pid,
                                     started_at=me.start_time, boot_id=boot_id(), channel_name="")  # fmt: skip
    make_execution(execution_id="lost-2")
    claimed, lease = actions.claim_next_execution(frozen, {"local"})
    recorder = actions.register_worker(worker_id="healthy-" + "0" * 24, host=dead_worker.host, pid=me.pid,
                                       started_at=me.start_time, boot_id=boot_id(), channel_name="")  # fmt: skip
    from terminals.models import ProcessLease

    ProcessLease.objects.filter(pk=lease.pk).update(worker=recorder, token=lease.token + 1)
    from terminals.outcome import Outcome

    actions.settle_execution(claimed, Outcome.unknown("its owner stopped answering"), worker=recorder,
                             token=lease.token + 1)  # fmt: skip
    row = next(r for r in console.unknown_queue() if r.execution.pk == claimed.pk)
    owner = next(check for check in row.checks if check.name == "owner")
    assert not owner.ok and frozen.worker_id[:12] in owner.detail
    assert row.owner_worker.pk == frozen.pk


def test_a_pass_run_by_hand_is_listed_as_one_and_the_queue_is_reached_from_executions(django_user_model, operator):
    from asgiref.sync import async_to_sync

    from executions.actions import Actor
    from terminals import console

    async_to_sync(console.recover_by_hand)(Actor.for_user(operator), "admin")
    looker = logged_in(staff(django_user_model, "looker", "view_worker"))
    assert b"recovery pass" in looker.get("/admin/terminals/worker/").content
    resolver = logged_in(staff(django_user_model, "resolver", "view_execution", "resolve_execution"))
    executions = resolver.get("/admin/executions/execution/")
    assert b"/admin/terminals/worker/unknowns/" in executions.content
    queue = resolver.get("/admin/terminals/worker/unknowns/")
    assert queue.status_code == 200 and b"/admin/terminals/worker/recovery/" not in queue.content  # not theirs

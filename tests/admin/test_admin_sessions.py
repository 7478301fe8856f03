"""Operator actions on sessions: confirmation, permissions, guards, and what the owner worker then does."""

from __future__ import annotations

import re
import time

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from executions.errors import TransitionRefused
from executions.models import Evidence, Execution, State
from terminals import actions
from terminals.models import ProcessLease, ProcessState, SessionEvent, SnapshotKind, TerminalSession
from tests.factories import TEST_ACTOR, grant, make_machine

CHANGELIST = "admin:terminals_terminalsession_changelist"


def _post_action(client, action: str, session, reason: str = "operator says so", confirm: bool = True):
    data = {"action": f"{action}_sessions", "_selected_action": [str(session.pk)]}
    if confirm:
        data.update(post="yes", reason=reason)
    return client.post(reverse(CHANGELIST), data, follow=True)


@pytest.mark.django_db
def test_actions_ask_for_confirmation_and_a_reason_first(client, admin_user, operator):
    session, _ = actions.open_terminal(make_machine("conf-box"), operator)
    client.force_login(admin_user)
    page = _post_action(client, "dismiss", session, confirm=False)
    assert "Dismiss the snapshot for these sessions" in page.text
    assert TerminalSession.objects.get(pk=session.pk).snapshot_hidden is False
    _post_action(client, "dismiss", session, reason="")  # a reason is required
    assert TerminalSession.objects.get(pk=session.pk).snapshot_hidden is False
    _post_action(client, "dismiss", session)
    assert TerminalSession.objects.get(pk=session.pk).snapshot_hidden is True
    event = SessionEvent.objects.get(session=session, kind="dismissed")
    assert (event.actor, event.reason) == ("user:admin", "operator says so")


@pytest.mark.django_db
def test_each_action_needs_its_own_permission(client, django_user_model, operator):
    session, _ = actions.open_terminal(make_machine("perm-box"), operator)
    staff = django_user_model.objects.create_user("viewer", password="x", is_staff=True)
    grant(staff, session.machine, "operate")  # the workspace allows it: the permissions decide
    staff.user_permissions.set(
        Permission.objects.filter(codename__in=["view_terminalsession", "dismiss_terminalsession"])
    )
    client.force_login(staff)
    page = client.get(reverse(CHANGELIST))
    assert "dismiss_sessions" in page.text and "kill_sessions" not in page.text
    _post_action(client, "kill", session)
    assert not ProcessLease.objects.filter(requested_action="kill").exists()


@pytest.mark.django_db
def test_an_action_not_allowed_in_the_current_state_is_refused_with_the_reason(operator):
    session, _ = actions.open_terminal(make_machine("closed-box"), operator)
    actions.close_session(session, reason="exited", actor=TEST_ACTOR)
    session.refresh_from_db()
    with pytest.raises(TransitionRefused, match="the process has already ended"):
        actions.operator_session_action(session, "kill", actor=TEST_ACTOR)
    with pytest.raises(TransitionRefused, match="no live process holds it"):
        actions.operator_session_action(
            actions.open_terminal(make_machine("pending-box"), operator)[0], "kill", actor=TEST_ACTOR
        )


@pytest.mark.django_db(transaction=True)
def test_admin_kill_ends_the_process_and_archives_a_failed_capture(stack, client, admin_user, operator):
    session, _ = actions.open_terminal(make_machine("kill-box"), operator)
    deadline = time.monotonic() + 15
    while Execution.objects.get(pk=session.execution_id).state != State.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    client.force_login(admin_user)
    page = _post_action(client, "kill", session)
    assert "Kill the session&#x27;s process tree: 1" in page.text
    while TerminalSession.objects.get(pk=session.pk).process_state != ProcessState.CLOSED:
        assert time.monotonic() < deadline + 15
        time.sleep(0.1)
    closed = TerminalSession.objects.get(pk=session.pk)
    assert (closed.snapshot_kind, closed.close_reason) == (SnapshotKind.ARCHIVED, "killed")
    assert bytes(closed.snapshot)  # the last screen is kept
    execution = Execution.objects.get(pk=session.execution_id)
    assert (execution.state, execution.evidence, execution.close_reason) == (State.COMPLETED, Evidence.KILLED, "killed")
    assert execution.events.filter(actor="user:admin", reason="operator says so").exists()
    detail = client.get(reverse("admin:terminals_terminalsession_change", args=[session.pk]))
    assert "Archived" in detail.text and "Killed" in detail.text


@pytest.mark.django_db
def test_the_session_page_is_view_only_and_a_posted_form_changes_nothing(client, admin_user, operator):
    session, _ = actions.open_terminal(make_machine("view-box"), operator)
    TerminalSession.objects.filter(pk=session.pk).update(viewer_id="window-a")
    client.force_login(admin_user)
    url = reverse("admin:terminals_terminalsession_change", args=[session.pk])
    page = client.get(url)
    assert page.status_code == 200 and 'name="_save"' not in page.text and 'name="viewer_id"' not in page.text
    # An older page's form, posted as it was: nothing is written, nobody is superseded, no event.
    events = SessionEvent.objects.filter(session=session).count()
    client.post(url, {"viewer_id": "", "events-TOTAL_FORMS": "0", "events-INITIAL_FORMS": "0", "_save": "Save"})
    after = TerminalSession.objects.get(pk=session.pk)
    assert (after.viewer_id, after.generation, after.process_state) == ("window-a", 1, ProcessState.LIVE)
    assert SessionEvent.objects.filter(session=session).count() == events


@pytest.mark.django_db
def test_the_sessions_list_shows_states_as_badges_and_messages_name_machines(client, admin_user, operator):
    session, _ = actions.open_terminal(make_machine("named-box"), operator)
    client.force_login(admin_user)
    listed = client.get(reverse(CHANGELIST)).text
    assert re.search(r'<span style="background:#16a34a;[^"]*" title="[^"]*">live</span>', listed), listed[-3000:]
    page = _post_action(client, "kill", session)  # refused: no worker holds it yet; the reason names the machine
    assert f"erminal {session.id} on named-box: " in page.text  # not "on 1"


@pytest.mark.django_db
def test_the_sessions_list_costs_the_same_queries_for_one_session_or_many(client, admin_user, operator):
    """Each row shows its lease's owner, token and heartbeat: read with the list, not once per row and column."""
    from django.conf import settings
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def sessions_with_leases(names):
        for name in names:
            actions.open_terminal(make_machine(name), operator)
            worker = actions.register_worker(
                worker_id=f"w-{name}", host=settings.TETHER_HOST, pid=1, started_at=1, boot_id="b", channel_name=name
            )
            assert actions.claim_next_execution(worker, {"local"}) is not None

    client.force_login(admin_user)
    sessions_with_leases(["q-1"])
    with CaptureQueriesContext(connection) as one:
        assert client.get(reverse(CHANGELIST)).status_code == 200
    sessions_with_leases(["q-2", "q-3", "q-4", "q-5"])
    with CaptureQueriesContext(connection) as five:
        page = client.get(reverse(CHANGELIST))
    assert page.text.count("w-q-") >= 5  # every row names its owner worker
    assert len(five.captured_queries) == len(one.captured_queries)


@pytest.mark.django_db
def test_the_sessions_list_says_which_shells_would_end_with_their_worker_and_never_shows_a_secret(
    client, admin_user, operator
):
    from django.conf import settings

    worker = actions.register_worker(
        worker_id="w-durable", host=settings.TETHER_HOST, pid=1, started_at=1, boot_id="b", channel_name="c"
    )
    handles = {
        "held-box": {"backend": "local", "marker": "m1", "holder": {"dir": "/x", "secret": "s3cr3t-never-shown"}},
        "plain-box": {"backend": "docker", "marker": "m2", "exec_id": "e", "unheld": "a read-only /tmp"},
    }
    for name, handle in handles.items():
        session, _ = actions.open_terminal(make_machine(name), operator)
        assert actions.claim_next_execution(worker, {"local"}) is not None
        ProcessLease.objects.filter(execution=session.execution).update(handle=handle)
    client.force_login(admin_user)
    listed = client.get(reverse(CHANGELIST)).text
    assert 'title="ends with its worker: a read-only /tmp">no</span>' in listed
    assert listed.count(">yes<") == 1
    assert "s3cr3t-never-shown" not in listed


def test_a_screen_is_shown_as_text_without_any_of_its_escapes():
    """A redraw carries modes as well as colours (a title, keypad mode ESC =, a charset): none is shown."""
    from terminals.admin import screen_text

    raw = b"\x1b]2;a title\x07\x1b[?1h\x1b=\x1b[1;31mred\x1b[0m\r\nnext\x1b>\x1b(B\x1b7!\x1b8"
    assert screen_text(raw) == "red\nnext!"

"""The portal's pages through Django's test client: login, CSRF, who may open and see what, and no JS needed."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from django.test import Client

from executions import actions as exec_actions
from executions.models import Backend, Evidence, Machine, State
from terminals import actions
from terminals.models import TerminalSession
from tests.factories import TEST_ACTOR, grant, make_execution, make_machine

pytestmark = pytest.mark.django_db


def logged_in(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def finish(session: TerminalSession, exit_code: int) -> None:
    """Record the session's shell as exited with ``exit_code``, the way the owner worker settles it."""
    execution = exec_actions.transition(
        session.execution, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR
    )
    execution = exec_actions.transition(execution, State.RUNNING, evidence=Evidence.OBSERVED, actor=TEST_ACTOR)
    exec_actions.transition(execution, State.COMPLETED, evidence=Evidence.EXITED, exit_code=exit_code, actor=TEST_ACTOR)
    actions.close_session(session, reason="exited", actor=TEST_ACTOR)


def test_every_page_redirects_anonymous_users_to_login(client):
    machine = make_machine("box", backend=Backend.DOCKER)
    for method, url in [
        ("get", "/"),
        ("get", f"/terminals/{uuid.uuid4()}/"),
        ("post", f"/machines/{machine.name}/open/"),
        ("get", f"/machines/{machine.name}/open/"),
        ("get", f"/machines/{machine.name}/history/"),
    ]:
        response = getattr(client, method)(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(f"/accounts/login/?next={url}"), url
    assert not TerminalSession.objects.exists()


def test_login_form_signs_in_and_goes_to_my_workspaces(client, alice):
    page = client.get("/accounts/login/?next=/")
    assert page.status_code == 200
    assert b'name="username"' in page.content and b'name="password"' in page.content
    response = client.post("/accounts/login/", {"username": "alice", "password": "alice-password", "next": "/"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_workspace_list_shows_only_usable_machines_with_plain_post_forms(alice, operator):
    grant(alice, make_machine("shared-box", backend=Backend.DOCKER))
    make_machine("other-team-box", backend=Backend.DOCKER)
    make_machine("host-shell", backend=Backend.LOCAL)
    page = logged_in(alice).get("/").content.decode()
    assert "shared-box" in page
    assert "other-team-box" not in page  # no grant: it does not exist for her
    assert "host-shell" not in page  # host shells are staff-only
    # Works without JavaScript: a real form with a CSRF token posting to the open URL.
    form = re.search(r'<form method="post" action="/machines/shared-box/open/">(.*?)</form>', page, re.S)
    assert form and 'name="csrfmiddlewaretoken"' in form.group(1) and 'type="submit"' in form.group(1)
    staff_page = logged_in(operator).get("/").content.decode()
    assert "shared-box" in staff_page and "host-shell" in staff_page and "other-team-box" in staff_page


def test_workspace_list_shows_the_open_session_state_and_the_last_exit(alice, bob):
    machine = make_machine("shared-box", backend=Backend.DOCKER)
    grant(alice, machine), grant(bob, machine)
    session, _ = actions.open_terminal(machine, alice)
    row = _row(logged_in(alice).get("/"), "shared-box")
    assert "live" in row and "Exited" not in row
    # Bob may use the machine but not see Alice's terminal.
    assert "in use by another user" in _row(logged_in(bob).get("/"), "shared-box")

    finish(session, 7)
    row = _row(logged_in(alice).get("/"), "shared-box")
    assert "Exited with code 7" in row and "no open terminal" in row
    # Alice's shell history is not Bob's business.
    assert "Exited with code 7" not in _row(logged_in(bob).get("/"), "shared-box")


def test_htmx_refresh_renders_only_the_list(alice):
    grant(alice, make_machine("shared-box", backend=Backend.DOCKER))
    response = logged_in(alice).get("/", headers={"HX-Request": "true"})
    body = response.content.decode()
    assert body.lstrip().startswith('<section id="workspace-list"')
    assert "<html" not in body and "shared-box" in body


def test_open_starts_a_session_and_redirects_to_its_page(alice):
    grant(alice, make_machine("shared-box", backend=Backend.DOCKER))
    client = logged_in(alice)
    response = client.post("/machines/shared-box/open/")
    session = TerminalSession.objects.get(user=alice)
    assert response.status_code == 302 and response["Location"] == f"/terminals/{session.id}/"
    # Opening again reattaches to the same session.
    assert client.post("/machines/shared-box/open/")["Location"] == f"/terminals/{session.id}/"
    assert TerminalSession.objects.count() == 1


def test_open_requires_post_and_csrf(alice):
    grant(alice, make_machine("shared-box", backend=Backend.DOCKER))
    client = logged_in(alice, enforce_csrf_checks=True)
    assert client.get("/machines/shared-box/open/").status_code == 405
    assert client.post("/machines/shared-box/open/").status_code == 403
    assert not TerminalSession.objects.exists()
    page = client.get("/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    response = client.post("/machines/shared-box/open/", {"csrfmiddlewaretoken": token})
    assert response.status_code == 302 and TerminalSession.objects.filter(user=alice).exists()


@pytest.mark.parametrize("backend", [Backend.LOCAL, Backend.TMUX])
def test_a_host_shell_does_not_exist_for_a_non_staff_user_even_with_a_grant(alice, backend, settings):
    host = make_machine("host-shell", backend=backend, ref="tether-test" if backend == Backend.TMUX else "")
    grant(alice, host)
    assert logged_in(alice).post("/machines/host-shell/open/").status_code == 404
    assert "host-shell" not in logged_in(alice).get("/").content.decode()
    assert not TerminalSession.objects.exists()
    settings.TETHER_HOST_SHELLS_FOR_ALL = True  # and a grant names it: hers to open
    assert logged_in(alice).post("/machines/host-shell/open/").status_code == 302


def test_unknown_machine_is_404(alice):
    assert logged_in(alice).post("/machines/no-such-box/open/").status_code == 404


def test_a_refused_open_is_a_message_not_an_error(alice, bob, settings):
    team = [alice, bob]
    for name in ("shared-box", "other-box", "third-box", "busy-box"):
        machine = make_machine(name, backend=Backend.DOCKER)
        for person in team:
            grant(person, machine)
    actions.open_terminal(Machine.objects.get(name="other-box"), alice)
    actions.open_terminal(Machine.objects.get(name="third-box"), bob)
    # Someone else's terminal.
    response = logged_in(bob).post("/machines/other-box/open/", follow=True)
    assert response.status_code == 200
    assert "other-box is in use by another user&#x27;s shell right now" in response.content.decode()
    # The per-user cap.
    settings.TETHER_SESSIONS_PER_USER = 1
    response = logged_in(alice).post("/machines/shared-box/open/", follow=True)
    assert response.status_code == 200
    assert "the limit is 1" in response.content.decode()
    assert TerminalSession.objects.filter(user=alice).count() == 1
    # A machine whose command slot another execution holds: said in a user's words, with the holder when it
    # is one's own (another's is "another user's command", tests/access/test_outside_findings.py).
    settings.TETHER_SESSIONS_PER_USER = 5
    from executions.actions import Actor

    busy = Machine.objects.get(name="busy-box")
    held = make_execution(busy, execution_id="nightly-build", actor=Actor.for_user(alice))
    response = logged_in(alice).post("/machines/busy-box/open/", follow=True)
    text = response.content.decode()
    assert response.status_code == 200 and "busy-box is about to run team-a/nightly-build" in text
    assert "command slot" not in text
    # One whose last outcome is unknown: why no shell starts, and who can do something about it.
    from executions.actions import transition
    from executions.models import Evidence, State

    held = transition(held, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR)
    transition(held, State.UNKNOWN, evidence=Evidence.CONTROLLER_LOST, actor=TEST_ACTOR)
    text = logged_in(alice).post("/machines/busy-box/open/", follow=True).content.decode()
    assert "ended with an unknown outcome" in text and "An operator must check it and resolve it first" in text


def test_terminal_page_of_a_foreign_or_unknown_session_is_404(alice, bob, operator):
    machine = make_machine("shared-box", backend=Backend.DOCKER)
    grant(alice, machine), grant(bob, machine)  # bob uses it too, but does not watch others' shells
    session, _ = actions.open_terminal(machine, alice)
    assert logged_in(bob).get(f"/terminals/{session.id}/").status_code == 404
    assert logged_in(bob).get(f"/terminals/{uuid.uuid4()}/").status_code == 404
    assert logged_in(alice).get(f"/terminals/{session.id}/").status_code == 200
    assert logged_in(operator).get(f"/terminals/{session.id}/").status_code == 200  # staff who may watch any
    grant(bob, machine, "watch")
    assert logged_in(bob).get(f"/terminals/{session.id}/").status_code == 200  # now he may watch it


def test_terminal_page_hands_its_state_to_the_script(alice):
    machine = make_machine("shared-box", backend=Backend.DOCKER)
    grant(alice, machine)
    session, _ = actions.open_terminal(machine, alice)
    client = logged_in(alice)
    page = client.get(f"/terminals/{session.id}/").content.decode()
    state = json.loads(re.search(r'<script id="terminal-state" type="application/json">(.*?)</script>', page).group(1))
    assert state["session"] == str(session.id)
    assert state["wsPath"] == f"/ws/terminals/{session.id}/"
    assert state["processState"] == "live" and state["generation"] == 1
    assert state["idleMinutes"] == 30
    assert "/static/dist/terminal.js" in page and "/static/dist/xterm.css" in page
    assert client.post(f"/terminals/{session.id}/").status_code == 405


def test_the_page_tells_the_idle_limit_the_shell_was_opened_with_not_this_processs_setting(alice, settings):
    settings.TETHER_IDLE_SECONDS = 600  # the web process that handled Open
    machine = make_machine("idle-box", backend=Backend.DOCKER)
    grant(alice, machine)
    session, _ = actions.open_terminal(machine, alice)
    settings.TETHER_IDLE_SECONDS = 3600  # another daphne, configured otherwise, serves the page
    page = logged_in(alice).get(f"/terminals/{session.id}/").content.decode()
    state = json.loads(re.search(r'<script id="terminal-state" type="application/json">(.*?)</script>', page).group(1))
    assert state["idleMinutes"] == 10


def _row(response, machine: str) -> str:
    match = re.search(rf'<tr data-machine="{machine}">(.*?)</tr>', response.content.decode(), re.S)
    assert match, f"no row for {machine}"
    return match.group(1)


def test_history_lists_a_machines_executions_with_honest_outcomes(alice, bob, operator):
    machine = make_machine("hist-box", backend=Backend.DOCKER)
    grant(alice, machine), grant(bob, machine)
    mine, _ = actions.open_terminal(machine, alice)
    finish(mine, 7)
    lost = make_execution(machine, execution_id="deploy-9")
    lost = exec_actions.transition(lost, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=TEST_ACTOR)
    exec_actions.transition(lost, State.UNKNOWN, evidence=Evidence.CONTROLLER_LOST, actor=TEST_ACTOR)

    page = logged_in(alice).get(f"/machines/{machine.name}/history/")
    assert page.status_code == 200
    assert "Exited with code 7" in page.text and ">7<" in page.text
    assert "deploy-9" not in page.text  # a staff command's record is not a user's history
    assert "alice" in page.text

    staff = logged_in(operator).get(f"/machines/{machine.name}/history/")
    assert "deploy-9" in staff.text and "Connection lost; outcome unknown" in staff.text
    assert "staff command" in staff.text

    assert "Exited with code 7" not in logged_in(bob).get(f"/machines/{machine.name}/history/").text
    host = make_machine("host-box", backend=Backend.LOCAL)
    grant(alice, host)
    assert logged_in(alice).get(f"/machines/{host.name}/history/").status_code == 404  # host shells: staff only
    assert logged_in(alice).get("/machines/no-such/history/").status_code == 404
    listing = logged_in(alice).get("/")
    assert f'href="/machines/{machine.name}/history/"' in listing.text

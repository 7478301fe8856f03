"""The one decision, asked of every surface by every kind of person and token (docs/access.md): a workspace one
may not reach answers as one that does not exist, byte for byte; a role reaches no further than it says.

The table below is the specification: one row per persona, one column per surface. Each cell is what that
persona gets there."""

from __future__ import annotations

import json
import re

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Group, Permission
from django.test import Client

from access.policy import Do, may
from api.tokens import create_token
from config.asgi import application
from executions.models import Backend
from terminals import actions
from tests.factories import grant, make_machine

pytestmark = pytest.mark.django_db

# persona: (sees the workspace, watches alice's shell there, may open a shell there, operates alice's shell)
ROLES = {
    "anonymous": (False, False, False, False),
    "outsider": (False, False, False, False),
    "inactive": (False, False, False, False),
    "watcher": (True, True, False, False),
    "user": (True, False, True, False),
    "operator": (True, True, True, True),
    "by_group": (True, False, True, False),
    "by_label": (True, False, True, False),
    "other_label": (False, False, False, False),
    "staff_plain": (False, False, False, False),
    "staff_watch": (True, True, False, False),
    "staff_use": (True, False, True, False),
    "staff_operate": (True, True, True, True),
    "superuser": (True, True, True, True),
}


@pytest.fixture
def world(django_user_model):
    """The team's docker workspace ``payments-box`` (label team=payments), alice's shell open on it, and one
    person of each kind."""
    machine = make_machine("payments-box", backend=Backend.DOCKER)
    from executions.actions import set_labels
    from tests.factories import TEST_ACTOR

    set_labels(machine, {"team": "payments"}, actor=TEST_ACTOR)
    machine.refresh_from_db()
    other = make_machine("search-box", backend=Backend.DOCKER)
    set_labels(other, {"team": "search"}, actor=TEST_ACTOR)

    def person(name, **extra):  # no password (hashing one costs most of a second): they are logged in directly
        return django_user_model.objects.create_user(username=name, password=None, **extra)

    alice = person("alice")
    grant(alice, machine, "use")
    people = {"alice": alice, "outsider": person("outsider"), "inactive": person("inactive", is_active=False)}
    grant(people["inactive"], machine, "use")
    for name, role in (("watcher", "watch"), ("user", "use"), ("operator", "operate")):
        people[name] = person(name)
        grant(people[name], machine, role)
    team = Group.objects.create(name="payments")
    people["by_group"] = person("by_group")
    people["by_group"].groups.add(team)
    grant(team, machine, "use")
    people["by_label"] = person("by_label")
    grant(people["by_label"], "team=payments", "use")
    people["other_label"] = person("other_label")
    grant(people["other_label"], "team=search", "operate")
    people["staff_plain"] = person("staff_plain", is_staff=True)
    for name, permission in (
        ("staff_watch", "observe_terminalsession"),
        ("staff_use", "use_every_workspace"),
        ("staff_operate", "operate_every_workspace"),
    ):
        people[name] = person(name, is_staff=True)
        people[name].user_permissions.add(Permission.objects.get(codename=permission))
    people["superuser"] = django_user_model.objects.create_superuser("superuser", "", None)
    session, _ = actions.open_terminal(machine, alice)
    return machine, session, people


def page_of(response) -> bytes:
    """A page as its reader sees it, less its per-request CSRF token."""
    return re.sub(rb'("X-CSRFToken": "|name="csrfmiddlewaretoken" value=")[^"]+"', rb"\1", response.content)


def client_of(people, name) -> Client:
    client = Client()
    if name != "anonymous":
        client.force_login(people[name]) if people[name].is_active else None
    return client


@pytest.mark.parametrize("persona", list(ROLES))
def test_the_decision_and_every_page_agree_for(world, persona):
    machine, session, people = world
    sees, watches, uses, operates = ROLES[persona]
    user = people.get(persona)
    if user is not None:
        assert may(user, Do.SEE, machine) is sees
        assert may(user, Do.WATCH, session) is watches
        assert may(user, Do.USE, machine) is uses
        assert may(user, Do.OPERATE, session) is operates
        assert may(user, Do.SHARE, session) is watches  # a share link gives watch, no more
        assert may(user, Do.TAKE_OVER, session) is (persona == "superuser")  # only with its own permission
    client = client_of(people, persona)
    if persona in ("anonymous", "inactive"):
        assert client.get("/").status_code == 302  # to the login page
        return

    listed = client.get("/").content.decode()
    assert ("payments-box" in listed) is sees
    assert "search-box" not in listed or persona in ("other_label", "superuser", "staff_watch", "staff_use",
                                                     "staff_operate")  # fmt: skip

    # Pages of a workspace one may not reach answer exactly as a workspace that does not exist.
    for path in ("/machines/{}/history/", "/machines/{}/recordings/"):
        page = client.get(path.format(machine.name))
        missing = client.get(path.format("no-such-box"))
        assert missing.status_code == 404
        if sees:
            assert page.status_code == 200
        else:
            assert (page.status_code, page_of(page)) == (404, page_of(missing))
    opened = client.post(f"/machines/{machine.name}/open/")
    missing = client.post("/machines/no-such-box/open/")
    if not sees:
        assert (opened.status_code, page_of(opened)) == (404, page_of(missing))
    elif watches:  # alice's shell is open there: who may watch it goes to it (as an observer)
        assert opened.status_code == 302 and opened["Location"] == f"/terminals/{session.id}/"
    else:  # who may only use it is told it is in use, not whose
        told = client.post(f"/machines/{machine.name}/open/", follow=True).content.decode()
        assert "in use by another user" in told and "alice" not in told

    page = client.get(f"/terminals/{session.id}/")
    if watches:
        assert page.status_code == 200 and b'"role": "observer"' in page.content.replace(b"&quot;", b'"')
    else:
        assert page.status_code == 404
        assert b"alice" not in page.content  # no hint of whose it is
    shares = client.post(f"/terminals/{session.id}/shares/", {"minutes": "15"})
    assert (shares.status_code != 404) is watches


TOKENS = {
    # persona, scopes, narrowed to: whether it lists payments-box, whether it may submit there
    "user-run": ("user", ["read", "run"], {}, True, True),
    "user-read": ("user", ["read"], {}, True, False),
    "watcher-run": ("watcher", ["read", "run"], {}, True, False),
    "outsider-run": ("outsider", ["read", "run"], {}, False, False),
    "user-run-elsewhere": ("user", ["read", "run"], {"labels": ["team=search"]}, False, False),
    "user-run-here": ("user", ["read", "run"], {"machines": ["payments-box"]}, True, True),
}


@pytest.mark.parametrize("case", list(TOKENS))
def test_the_api_agrees_for_a_token(world, case):
    people = world[2]
    persona, scopes, narrowed, lists, submits = TOKENS[case]
    _, raw = create_token(people[persona], name="t", scopes=scopes, **narrowed)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    listed = api.get("/api/v1/machines")
    if "read" in scopes:
        names = [row["name"] for row in listed.json()]
        assert ("payments-box" in names) is lists
    spec = {"scope": "ci", "id": "one", "argv": ["true"]}
    answer = api.post("/api/v1/executions", {**spec, "machine": "payments-box"}, content_type="application/json")
    missing = api.post("/api/v1/executions", {**spec, "machine": "no-such-box"}, content_type="application/json")
    if "run" not in scopes:
        assert answer.status_code == 403 and answer.json()["code"] == "insufficient_scope"
    elif submits:
        # Allowed: the slot is alice's shell's, and it is said without naming it (it is hers).
        assert answer.status_code == 409 and answer.json()["code"] == "slot_taken", answer.content
        assert "another user's" in answer.json()["detail"] and "held_by" not in answer.json()
        assert "terminal-" not in answer.content.decode() and "alice" not in answer.content.decode()
    else:
        assert answer.status_code == 404
        assert answer.json()["detail"] == missing.json()["detail"].replace("no-such-box", "payments-box")


async def _socket(people, persona, session) -> tuple[bool, WebsocketCommunicator]:
    client = Client()
    await sync_to_async(client.force_login)(people[persona])
    cookie = client.cookies["sessionid"].value
    socket = WebsocketCommunicator(
        application, f"/ws/terminals/{session.id}/",
        headers=[(b"cookie", f"sessionid={cookie}".encode()), (b"origin", b"http://testserver"),
                 (b"host", b"testserver")],
    )  # fmt: skip
    connected, _ = await socket.connect()
    return connected, socket


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("persona", ["outsider", "watcher", "user", "staff_plain", "other_label", "superuser"])
async def test_the_terminal_socket_agrees_for(world, persona):
    _, session, people = world
    watches = ROLES[persona][1]
    connected, socket = await _socket(people, persona, session)
    assert connected is watches
    if connected:
        await socket.receive_json_from()  # hello
        # Another user's shell: watching is all; writing into it is refused unless taken over.
        await socket.send_to(text_data=json.dumps({"type": "attach", "since": 0, "cols": 80, "rows": 24}))
        said = await socket.receive_json_from(timeout=5)
        assert said["type"] == "error" and "alice's shell" in said["message"]
        await socket.disconnect()


@pytest.mark.parametrize("persona", ["staff_plain", "staff_watch", "staff_use", "staff_operate", "superuser"])
def test_the_admin_agrees_for(world, persona):
    """Every staff persona holds the admin's permissions on sessions: only the workspace decides what they see
    of alice's shell there, and whether its actions reach it."""
    _, session, people = world
    _, watches, _, operates = ROLES[persona]
    user = people[persona]
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_terminalsession", "dismiss_terminalsession"])
    )
    client = Client()
    client.force_login(user)
    listed = client.get("/admin/terminals/terminalsession/").content.decode()
    assert (str(session.id) in listed) is watches
    change = client.get(f"/admin/terminals/terminalsession/{session.pk}/change/")
    assert change.status_code == (200 if watches else 302)  # one not reached is "not found" there
    form = {"action": "dismiss_sessions", "_selected_action": [str(session.pk)], "post": "yes", "reason": "table"}
    client.post("/admin/terminals/terminalsession/", form)
    session.refresh_from_db()
    assert session.snapshot_hidden is operates


@pytest.mark.parametrize("persona", ["user", "operator", "staff_watch", "staff_operate", "superuser"])
def test_no_token_reads_another_users_commands_whatever_its_role(world, persona):
    """Watching a shell is the page's and the socket's, beside its writer, who sees who watches; the API reads
    only its user's own commands and shells, whatever their role or permissions."""
    _, session, people = world
    _, raw = create_token(people[persona], name="t", scopes=["read", "run", "terminals"])
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}")
    for path in (f"/api/v1/executions/{session.execution_id}", f"/api/v1/terminals/{session.id}"):
        assert api.get(path).status_code == 404, path
    assert api.post(f"/api/v1/executions/{session.execution_id}/cancel", {},
                    content_type="application/json").status_code == 404  # fmt: skip

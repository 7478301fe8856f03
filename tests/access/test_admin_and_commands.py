"""Granting as staff do it: the commands (grant, revoke, access_report) and the admin (grants, a machine's labels
and who can reach it, a group's grants). Each change is an audit event naming who; bad input writes nothing."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import Group, Permission
from django.core.management import CommandError, call_command
from django.test import Client

from access.models import Grant, GrantEvent
from access.policy import Do, may
from executions.models import Backend
from tests.factories import grant, make_machine

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_grant_revoke_and_report_from_the_command_line(alice, bob, admin_user):
    box = make_machine("pay-box", backend=Backend.DOCKER)
    team = Group.objects.create(name="payments")
    team.user_set.add(bob)
    assert "granted: use for user alice on machine pay-box" in run("grant", "--user", "alice", "--machine", "pay-box",
                                                                   "--role", "use", "--by", "admin")  # fmt: skip
    said = run("grant", "--group", "payments", "--label", "team=payments", "--role", "watch")
    assert "granted" in said and "matches no machine yet" in said
    assert not may(bob, Do.SEE, box)
    from executions.actions import set_labels
    from tests.factories import TEST_ACTOR

    set_labels(box, {"team": "payments"}, actor=TEST_ACTOR)
    assert may(bob, Do.WATCH, box) and not may(bob, Do.USE, box)
    assert "reaches 1 machine(s) now: pay-box" in run("grant", "--group", "payments", "--label", "team=payments",
                                                      "--role", "operate")  # fmt: skip
    report = run("access_report", "pay-box", "--history")
    assert "alice" in report and "use on the machine, through a grant to them" in report
    assert "bob" in report and "operate on label team=payments, through group payments" in report
    assert "admin" in report and "superuser" in report
    assert "user:admin: granted: use for user alice" in report  # the history names who
    assert "changed: operate" in report or "operate" in report

    revoked = run("revoke", "--user", "alice", "--machine", "pay-box", "--reason", "left the team")
    assert "revoked" in revoked and not may(alice, Do.SEE, box)
    event = GrantEvent.objects.filter(kind="revoked").get()
    assert (event.actor, event.was, event.reason) == ("command:revoke", "use", "left the team")

    # Bad input: a clear error, nothing written.
    before = (Grant.objects.count(), GrantEvent.objects.count())
    for args, expected in [
        (("--user", "nobody", "--machine", "pay-box", "--role", "use"), "no user named 'nobody'"),
        (("--group", "nogroup", "--machine", "pay-box", "--role", "use"), "no group named 'nogroup'"),
        (("--user", "alice", "--machine", "no-box", "--role", "use"), "no machine named 'no-box'"),
        (("--user", "alice", "--label", "team", "--role", "use"), "must be key=value"),
        (("--user", "alice", "--label", "Team=pay ments", "--role", "use"), "label key 'Team'"),
    ]:
        with pytest.raises(CommandError, match=expected):
            run("grant", *args)
    with pytest.raises(CommandError, match="no such grant"):
        run("revoke", "--user", "alice", "--machine", "pay-box")
    assert (Grant.objects.count(), GrantEvent.objects.count()) == before


def test_the_admin_grants_shows_who_can_reach_a_machine_sets_its_labels_and_revokes(admin_user, alice, bob):
    box = make_machine("pay-box", backend=Backend.DOCKER)
    team = Group.objects.create(name="payments")
    team.user_set.add(bob)
    client = Client()
    client.force_login(admin_user)

    added = client.post("/admin/access/grant/add/", {"user": alice.pk, "machine": box.pk, "role": "use", "note": "x"})
    assert added.status_code == 302, added.content[:2000]
    assert may(alice, Do.USE, box)
    assert GrantEvent.objects.get(kind="granted").actor == "user:admin"
    refused = client.post("/admin/access/grant/add/", {"user": alice.pk, "group": team.pk, "machine": box.pk,
                                                       "role": "use"})  # fmt: skip
    assert b"exactly one user or one group" in refused.content

    labels = client.post(f"/admin/executions/machine/{box.pk}/labels/", {"labels": "team=payments, env=prod"})
    assert labels.status_code == 302
    box.refresh_from_db()
    assert box.labels == {"team": "payments", "env": "prod"}
    bad = client.post(f"/admin/executions/machine/{box.pk}/labels/", {"labels": "team"})
    assert b"must be key=value" in bad.content
    client.post("/admin/access/grant/add/", {"group": team.pk, "label": "team=payments", "role": "watch"})
    assert may(bob, Do.WATCH, box)

    page = client.get(f"/admin/executions/machine/{box.pk}/change/").content.decode()
    assert "Who can reach this workspace" in page and "alice" in page  # the grants inline
    reach = client.get(f"/admin/executions/machine/{box.pk}/reach/").content.decode()
    assert "bob" in reach and "watch on label team=payments, through group payments" in reach
    assert "granted: use for user alice on machine pay-box" in reach  # its history
    assert "label team=payments" in client.get(f"/admin/auth/group/{team.pk}/change/").content.decode()

    grant_pk = Grant.objects.get(user=alice).pk
    revoked = client.post("/admin/access/grant/", {"action": "revoke_grants", "_selected_action": [grant_pk]})
    assert revoked.status_code == 302 and not may(alice, Do.SEE, box)
    assert GrantEvent.objects.filter(kind="revoked", actor="user:admin").count() == 1


def test_staff_without_the_access_permissions_neither_see_nor_change_grants(django_user_model):
    box = make_machine("pay-box", backend=Backend.DOCKER)
    staff = django_user_model.objects.create_user("staff", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_machine"))
    grant(staff, box, "use")
    client = Client()
    client.force_login(staff)
    assert client.get("/admin/access/grant/").status_code == 403
    assert client.get(f"/admin/executions/machine/{box.pk}/reach/").status_code == 403
    assert client.post(f"/admin/executions/machine/{box.pk}/labels/", {"labels": "a=b"}).status_code == 403
    box.refresh_from_db()
    assert box.labels == {}


def test_a_token_made_on_the_tokens_page_can_be_narrowed_to_machines_and_labels_never_widened(alice):
    box = make_machine("pay-box", backend=Backend.DOCKER)
    make_machine("other-box", backend=Backend.DOCKER)
    grant(alice, box)
    client = Client()
    client.force_login(alice)
    made = client.post("/tokens/", {"name": "ci", "scopes": ["read"], "days": "30", "machines": "pay-box",
                                    "labels": "team=payments"})  # fmt: skip
    assert made.status_code == 200 and b"only on pay-box and team=payments" in made.content
    from api.models import ApiToken

    token = ApiToken.objects.get(name="ci")
    assert (token.machines, token.labels) == (["pay-box"], ["team=payments"])
    # A machine she cannot reach is refused as one that does not exist; a malformed label is said so.
    for field, value, said in [("machines", "other-box", b"no machine &#x27;other-box&#x27; you may reach"),
                               ("labels", "team", b"must be key=value")]:  # fmt: skip
        refused = client.post("/tokens/", {"name": "x", "scopes": ["read"], "days": "30", field: value})
        assert refused.status_code == 400 and said in refused.content, refused.content[-1500:]
    assert ApiToken.objects.count() == 1

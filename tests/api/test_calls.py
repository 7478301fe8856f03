"""The API through Django's test client: tokens, scopes, problems, limits, object checks and the audit."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.contrib.staticfiles import finders
from django.test import Client
from django.utils import timezone

from api.models import ApiCall, ApiToken, ApiTokenEvent
from api.tokens import create_token, revoke_token
from executions.actions import Actor, transition
from executions.actions.machines import add_machine
from executions.models import Evidence, Execution, State
from tests.factories import grant, make_execution, make_spec

pytestmark = pytest.mark.django_db


def call(method: str, path: str, token: str | None = None, **body):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}
    client = Client()
    if method == "GET":
        return client.get(f"/api/v1{path}", body or None, **headers)
    return client.generic(method, f"/api/v1{path}", __import__("json").dumps(body), "application/json", **headers)


@pytest.fixture
def docker_box(alice, bob):
    """Team A's docker workspace: alice and bob are in the team, which uses it."""
    from django.contrib.auth.models import Group

    box = add_machine(name="box", backend="docker", ref="some-container", scope="team-a", actor=Actor.command("t"))
    team = Group.objects.create(name="team-a")
    team.user_set.add(alice, bob)
    grant(team, box)
    return box


def token_for(user, *scopes, **options) -> str:
    return create_token(user, name=options.pop("name", "ci"), scopes=list(scopes or ["read", "run"]), **options)[1]


def test_a_token_is_shown_once_kept_hashed_and_found_by_its_prefix(alice):
    token, raw = create_token(alice, name="laptop", scopes=["read"])
    assert raw.startswith(f"tether_{token.prefix}_") and len(raw) > 50
    stored = ApiToken.objects.get(pk=token.pk)
    assert raw not in str(stored.__dict__) and stored.digest != raw
    assert ApiTokenEvent.objects.filter(token=token, kind="created", user=alice).exists()
    assert call("GET", "/machines", raw).status_code == 200


def test_without_a_token_or_with_a_wrong_one_every_call_is_a_problem(alice):
    raw = token_for(alice)
    for token in (None, "nope", raw[:-2] + "xx", "tether_000000000000_" + "a" * 43):
        response = call("GET", "/machines", token)
        assert response.status_code == 401
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["code"] == "unauthenticated"
    # A session cookie is no API credential.
    client = Client()
    client.force_login(alice)
    assert client.get("/api/v1/machines").status_code == 401


def test_revoked_and_expired_tokens_are_refused_and_say_so(alice, bob):
    raw = token_for(alice)
    token = ApiToken.objects.get(user=alice)
    revoke_token(token.pk, by=alice, reason="leaked in a log")
    response = call("GET", "/machines", raw)
    assert (response.status_code, response.json()["code"]) == (401, "token_revoked")
    with pytest.raises(Exception, match="already revoked"):
        revoke_token(token.pk, by=alice)  # one revoke wins
    old, raw_old = create_token(bob, name="old", scopes=["read"])
    ApiToken.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert call("GET", "/machines", raw_old).json()["code"] == "token_expired"
    bob.is_active = False
    bob.save()
    _, raw_bob = create_token(bob, name="new", scopes=["read"])
    assert call("GET", "/machines", raw_bob).status_code == 401


def test_scopes_refuse_what_they_do_not_allow(alice, docker_box):
    read_only = token_for(alice, "read", name="reader")
    response = call("POST", "/executions", read_only, scope="ci", id="1", machine="box", argv=["true"])
    assert response.status_code == 403
    assert response.json() | {} == response.json() and response.json()["code"] == "insufficient_scope"
    assert response.json()["needed"] == "run"
    runner = token_for(alice, "run", name="runner")
    assert call("GET", "/machines", runner).json()["code"] == "insufficient_scope"
    assert call("GET", "/terminals", runner).json()["code"] == "insufficient_scope"
    assert not Execution.objects.exists()


def test_submit_is_idempotent_and_another_spec_is_a_conflict_naming_both_digests(alice, docker_box):
    raw = token_for(alice)
    first = call("POST", "/executions", raw, scope="ci", id="build-1", machine="box", argv=["make", "test"])
    assert first.status_code == 201 and first.json()["created"] is True
    again = call("POST", "/executions", raw, scope="ci", id="build-1", machine="box", argv=["make", "test"])
    assert again.status_code == 200 and again.json()["created"] is False
    assert again.json()["execution"]["id"] == first.json()["execution"]["id"]
    other = call("POST", "/executions", raw, scope="ci", id="build-1", machine="box", argv=["make", "lint"])
    problem = other.json()
    assert other.status_code == 409 and problem["code"] == "identity_conflict"
    assert problem["existing_digest"] == first.json()["execution"]["spec_digest"]
    assert problem["submitted_digest"] == make_spec("make", "lint").digest != problem["existing_digest"]
    assert Execution.objects.count() == 1
    execution = Execution.objects.get()
    assert execution.requested_by == alice
    assert execution.events.get().actor == "user:alice token:ci"  # the audit names the token


def test_bad_input_gets_a_clear_problem_and_changes_nothing(alice, docker_box):
    raw = token_for(alice)
    cases = [
        ({"scope": "ci", "id": "1", "machine": "box", "argv": []}, 422, "validation_error"),
        ({"scope": "ci", "id": "1", "machine": "box"}, 422, "validation_error"),
        ({"scope": "ci", "id": "bad id!", "machine": "box", "argv": ["x"]}, 422, "validation_error"),
        ({"scope": "ci", "id": "1", "machine": "box", "argv": ["x"], "cols": 9999}, 422, "validation_error"),
        ({"scope": "ci", "id": "1", "machine": "nowhere", "argv": ["x"]}, 404, "not_found"),
    ]
    for body, status, code in cases:
        response = call("POST", "/executions", raw, **body)
        assert (response.status_code, response.json()["code"]) == (status, code), (body, response.json())
        assert response.json()["detail"]
    huge = call("POST", "/executions", raw, scope="ci", id="1", machine="box", argv=["x" * (2 * 1024 * 1024)])
    assert (huge.status_code, huge.json()["code"]) == (413, "too_large")
    assert not Execution.objects.exists()
    assert call("GET", "/executions/abc", raw).status_code == 422


@pytest.mark.django_db(transaction=True)  # the output read is an async view: its database thread must see the rows
def test_host_machines_and_other_users_records_are_not_yours(alice, bob, docker_box):
    add_machine(name="host", backend="local", scope="team-a", actor=Actor.command("t"))
    alice_raw, bob_raw = token_for(alice), token_for(bob)
    assert [m["name"] for m in call("GET", "/machines", alice_raw).json()] == ["box"]  # no host shell for non-staff
    refused = call("POST", "/executions", alice_raw, scope="ci", id="1", machine="host", argv=["id"])
    assert refused.status_code == 404
    mine = call("POST", "/executions", alice_raw, scope="ci", id="1", machine="box", argv=["id"]).json()["execution"]
    assert call("GET", f"/executions/{mine['id']}", bob_raw).status_code == 404
    assert call("GET", f"/executions/{mine['id']}/output", bob_raw).status_code == 404
    assert call("GET", "/executions", bob_raw, scope="ci").json() == []
    assert call("GET", "/executions/lookup", bob_raw, scope="ci", id="1").status_code == 404
    taken = call("POST", "/executions", bob_raw, scope="ci", id="1", machine="box", argv=["id"])
    assert taken.status_code == 409 and "another user" in taken.json()["detail"]
    assert "existing_digest" not in taken.json()  # nothing of alice's record leaks
    assert call("POST", f"/executions/{mine['id']}/cancel", bob_raw).status_code == 404
    assert call("GET", "/executions/lookup", alice_raw, scope="ci", id="1").json()["id"] == mine["id"]


def test_cancel_a_pending_command_and_resolve_needs_the_permission_and_the_checks(alice, operator, docker_box):
    raw = token_for(alice)
    pending = call("POST", "/executions", raw, scope="ci", id="1", machine="box", argv=["id"]).json()["execution"]
    cancelled = call("POST", f"/executions/{pending['id']}/cancel", raw, reason="not needed")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    again = call("POST", f"/executions/{pending['id']}/cancel", raw)
    assert (again.status_code, again.json()["code"]) == (409, "state_conflict")

    execution = make_execution(docker_box, scope="ci", execution_id="2", actor=Actor.for_user(alice))
    execution = transition(execution, State.DISPATCHED, evidence=Evidence.CLAIMED, actor=Actor.command("t"))
    transition(execution, State.UNKNOWN, evidence=Evidence.CONTROLLER_LOST, actor=Actor.command("t"))
    assert call("POST", f"/executions/{execution.pk}/resolve", raw, note="gone").json()["code"] == "forbidden"
    staff = token_for(operator, name="ops")
    assert Permission.objects.filter(codename="resolve_execution").exists()
    refused = call("POST", f"/executions/{execution.pk}/resolve", staff, note="   ")
    assert refused.status_code in (409, 422)
    refused = call("POST", f"/executions/{execution.pk}/resolve", staff, note="the container was removed")
    problem = refused.json()
    assert refused.status_code == 409 and problem["code"] == "resolve_refused"
    assert {check["name"] for check in problem["checks"]} >= {"owner", "machine", "process", "note"}
    assert Execution.objects.get(pk=execution.pk).state == State.UNKNOWN


def test_rate_limit_is_429_with_retry_after_and_per_token(alice, settings):
    settings.TETHER_API_CALLS_PER_MINUTE = 5
    raw, other = token_for(alice, name="busy"), token_for(alice, name="calm")
    answers = [call("GET", "/machines", raw) for _ in range(7)]
    assert [a.status_code for a in answers[:5]] == [200] * 5
    limited = answers[5]
    assert limited.status_code == 429 and limited.json()["code"] == "rate_limited"
    assert 1 <= int(limited["Retry-After"]) <= 60
    assert call("GET", "/machines", other).status_code == 200  # another token has its own count


def test_every_call_with_a_known_token_is_audited_with_its_name(alice):
    raw = token_for(alice, "read", name="nightly")
    call("GET", "/machines", raw)
    call("GET", "/executions/999", raw)
    call("POST", "/executions", raw, scope="ci", id="1", machine="box", argv=["x"])
    calls = list(ApiCall.objects.order_by("at", "id").values_list("token__name", "method", "path", "status", "problem"))
    assert calls == [
        ("nightly", "GET", "/api/v1/machines", 200, ""),
        ("nightly", "GET", "/api/v1/executions/999", 404, "not_found"),
        ("nightly", "POST", "/api/v1/executions", 403, "insufficient_scope"),
    ]


def test_the_schema_and_the_docs_are_served_to_people_signed_in_and_to_tokens(alice):
    anonymous = Client()
    assert anonymous.get("/api/v1/openapi.json").json()["code"] == "unauthenticated"
    assert anonymous.get("/api/v1/docs", HTTP_ACCEPT="text/html").status_code == 302  # to the login page
    raw = token_for(alice, "read")
    assert anonymous.get("/api/v1/openapi.json", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    client = Client()
    client.force_login(alice)
    schema = client.get("/api/v1/openapi.json").json()
    assert schema["info"]["title"] == "Tether API"
    paths = set(schema["paths"])
    assert {"/api/v1/executions", "/api/v1/executions/{pk}/output", "/api/v1/terminals/{session_id}/input"} <= paths
    docs = client.get("/api/v1/docs")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()
    # Its script and styles are Tether's own static files (served by WhiteNoise in production), not a CDN's.
    assets = re.findall(r'(?:src|href)="/static/([^"?]+)', docs.content.decode())
    assert any(asset.endswith("swagger-ui-bundle.js") for asset in assets), assets
    assert all(finders.find(asset) for asset in assets), assets


def test_the_tokens_page_shows_a_new_token_once_and_revokes_only_your_own(alice, bob):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    page = client.get("/tokens/")
    assert page.status_code == 200 and b"Make a token" in page.content
    csrf = page.cookies["csrftoken"].value
    assert client.post("/tokens/", {"name": "x", "scopes": ["read"]}).status_code == 403  # no CSRF token
    made = client.post("/tokens/", {"name": "my laptop", "scopes": ["read", "terminals"], "days": "7",
                                    "csrfmiddlewaretoken": csrf})  # fmt: skip
    raw = made.context["new_raw"]
    assert raw.encode() in made.content and made.context["new_token"].scopes == ["read", "terminals"]
    assert raw.encode() not in client.get("/tokens/").content  # shown once
    assert call("GET", "/machines", raw).status_code == 200
    refused = client.post("/tokens/", {"name": "", "scopes": ["read"], "csrfmiddlewaretoken": csrf})
    assert refused.status_code == 400 and b"needs a name" in refused.content
    refused = client.post("/tokens/", {"name": "y", "scopes": ["root"], "csrfmiddlewaretoken": csrf})
    assert refused.status_code == 400 and b"choose one or more scopes" in refused.content
    refused = client.post("/tokens/", {"name": "y", "scopes": ["read"], "days": "9999", "csrfmiddlewaretoken": csrf})
    assert refused.status_code == 400

    bobs, _ = create_token(bob, name="bob's", scopes=["read"])
    assert client.post(f"/tokens/{bobs.pk}/revoke/", {"csrfmiddlewaretoken": csrf}).status_code == 404
    assert ApiToken.objects.get(pk=bobs.pk).revoked_at is None
    mine = ApiToken.objects.get(user=alice, name="my laptop")
    client.post(f"/tokens/{mine.pk}/revoke/", {"csrfmiddlewaretoken": csrf})
    assert call("GET", "/machines", raw).json()["code"] == "token_revoked"
    assert ApiTokenEvent.objects.get(token=mine, kind="revoked").user == alice


def test_staff_revoke_other_users_tokens_in_the_admin_only_with_the_permission(alice, operator, admin_user):
    token, raw = create_token(alice, name="ci", scopes=["read"])
    form = {"action": "revoke_tokens", "_selected_action": [token.pk], "post": "yes", "reason": "left the team"}
    staff = Client()
    staff.force_login(operator)  # staff, but without the API app's permissions
    staff.post("/admin/api/apitoken/", form)
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None
    boss = Client()
    boss.force_login(admin_user)
    listing = boss.get("/admin/api/apitoken/")
    assert b"Revoke the selected API tokens" in listing.content and token.digest.encode() not in listing.content
    asked = boss.post("/admin/api/apitoken/", {**form, "post": ""})
    assert b"Revoke these API tokens?" in asked.content
    boss.post("/admin/api/apitoken/", form)
    revoked = ApiToken.objects.get(pk=token.pk)
    assert revoked.revoked_by == admin_user and revoked.revoke_reason == "left the team"
    assert call("GET", "/machines", raw).json()["code"] == "token_revoked"
    assert boss.get(f"/admin/api/apicall/?token__id__exact={token.pk}").status_code == 200

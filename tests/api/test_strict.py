"""The API held strictly at its edges (issue 42): unknown fields refused with their names, NUL bytes refused as
malformed (they were 500s), a body that is no object refused (a cancel with `[null,null]` killed the command),
every refusal under /api/ a problem (405 was HTML, a multipart body without a boundary an empty 400), and an
expected 503 logged as a warning with its code, not as django.request's ERROR."""

from __future__ import annotations

import json
import logging

import pytest

from api.tokens import create_token
from executions.models import Backend, Execution, State
from tests.factories import grant, make_machine

pytestmark = pytest.mark.django_db

SUBMIT = {"scope": "ci", "id": "job-1", "machine": "box", "argv": ["true"]}


@pytest.fixture
def api(client, alice):
    machine = make_machine("box", backend=Backend.DOCKER)
    grant(alice, machine, "use")
    _, raw = create_token(alice, name="strict", scopes=["run", "read", "terminals"])
    headers = {"Authorization": f"Bearer {raw}"}

    class Api:
        def post(self, path, body, content_type="application/json"):
            return client.post(f"/api/v1{path}", body, content_type=content_type, headers=headers)

        def get(self, path):
            return client.get(f"/api/v1{path}", headers=headers)

        def call(self, method, path):
            return getattr(client, method)(f"/api/v1{path}", headers=headers)

    return Api()


def problem(answer) -> dict:
    assert answer["Content-Type"].startswith("application/problem+json"), (answer.status_code, answer.content[:200])
    return answer.json()


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({**SUBMIT, "evn": {"A": "1"}}, ["evn"]),  # the typo that ran a command without its env
        ({**SUBMIT, "timeout_seconds": 5, "tty": False}, ["timeout_seconds", "tty"]),
    ],
)
def test_unknown_fields_are_refused_by_name_and_nothing_runs(api, body, fields):
    answer = api.post("/executions", body)
    assert answer.status_code == 400
    said = problem(answer)
    assert said["code"] == "unknown_fields" and said["fields"] == fields
    assert all(repr(name) in said["detail"] for name in fields)
    assert not Execution.objects.exists()


@pytest.mark.parametrize("field", ["scope", "id", "machine", "cwd", "argv", "env"])
def test_a_nul_byte_in_a_body_is_refused_as_malformed_never_a_500(api, field):
    value = {"argv": ["echo", "a\x00b"], "env": {"A": "1\x00"}}.get(field, "a\x00b")
    answer = api.post("/executions", {**SUBMIT, field: value})
    assert answer.status_code == 400
    said = problem(answer)
    assert said["code"] == "invalid_request" and "NUL byte" in said["detail"] and field in said["detail"]
    assert not Execution.objects.exists()


@pytest.mark.parametrize(
    "path",
    [
        "/executions?scope=a%00b",
        "/executions/lookup?scope=ci&id=x%00",
        "/executions?scope=ci&li%00mit=3",
        "/machines%00",
    ],
)
def test_a_nul_byte_in_a_query_or_path_is_refused_as_malformed(api, path):
    answer = api.get(path)
    assert answer.status_code == 400 and problem(answer)["code"] == "invalid_request"
    assert "NUL byte" in answer.json()["detail"]


@pytest.mark.django_db(transaction=True)  # async endpoints reach the database from their own thread
def test_a_nul_key_is_still_a_key_in_terminal_input(api):
    """Ctrl-@ is a keystroke: terminal input's text may hold it (the check is on the names, not the keys)."""
    opened = api.post("/terminals", {"machine": "box"})
    assert opened.status_code == 201, opened.content
    session = opened.json()["terminal"]["id"]
    answer = api.post(f"/terminals/{session}/input", {"seq": 1, "data": "\x00"})
    # Past the body's checks: no worker holds this shell in this test, so it is that, not a refusal of the key.
    assert (answer.status_code, problem(answer)["code"]) == (503, "owner_unavailable"), answer.content
    said = api.post(f"/terminals/{session}/input", {"seq": 2, "data": "x", "client": "a\x00"})
    assert said.status_code == 400 and "client" in problem(said)["detail"]


@pytest.mark.parametrize("body", ["[null,null]", '"cancel"', "42", "null"])
def test_a_cancel_whose_body_is_not_an_object_is_refused_and_kills_nothing(api, body):
    submitted = api.post("/executions", SUBMIT)
    assert submitted.status_code == 201
    pk = submitted.json()["execution"]["id"]
    answer = api.post(f"/executions/{pk}/cancel", body)
    assert answer.status_code == 400, answer.content
    assert problem(answer)["code"] == "invalid_request"
    assert Execution.objects.get(pk=pk).state == State.PENDING


def test_a_method_a_path_does_not_take_is_a_problem_with_allow(api):
    answer = api.call("delete", "/executions")
    assert answer.status_code == 405
    said = problem(answer)
    assert said["code"] == "method_not_allowed" and "DELETE" in said["detail"]
    assert "GET" in answer["Allow"] and "POST" in answer["Allow"]


def test_a_path_that_is_not_there_and_a_form_without_a_boundary_are_problems(api):
    missing = api.get("/no-such-thing")
    assert missing.status_code == 404 and problem(missing)["code"] == "not_found"
    form = api.post("/executions", "x", content_type="multipart/form-data")
    assert (form.status_code, problem(form)["code"]) == (415, "unsupported_media_type")


@pytest.mark.django_db(transaction=True)
def test_an_expected_503_is_a_warning_with_its_code_not_an_error(api, caplog):
    opened = api.post("/terminals", {"machine": "box"})
    session = opened.json()["terminal"]["id"]
    with caplog.at_level(logging.INFO):
        answer = api.post(f"/terminals/{session}/resize", {"cols": 100, "rows": 30})  # no worker holds it
    assert answer.status_code == 503 and problem(answer)["code"] == "owner_unavailable"
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert not errors, [record.getMessage() for record in errors]
    assert any(
        record.levelno == logging.WARNING and "owner_unavailable" in record.getMessage() for record in caplog.records
    )


def test_the_constraints_are_in_the_schema_and_held(api):
    """What the code refuses, the schema says (a generated client knows it before it asks)."""
    schema = api.get("/openapi.json").json()["components"]["schemas"]
    submit, keys = schema["SubmitIn"]["properties"], schema["InputIn"]["properties"]
    assert (
        submit["scope"]["pattern"].startswith("^[A-Za-z0-9]") and submit["id"]["pattern"] == submit["scope"]["pattern"]
    )
    assert submit["machine"]["pattern"] and (
        submit["cols"]["anyOf"][0]["maximum"],
        submit["rows"]["anyOf"][0]["maximum"],
    ) == (500, 200)
    assert keys["data_b64"]["anyOf"][0]["pattern"] and keys["data"]["anyOf"][0]["maxLength"] == 65536
    for body in (
        {**SUBMIT, "scope": "-leading-dash"},
        {**SUBMIT, "id": "has space"},
        {**SUBMIT, "machine": "no/slash"},
        {**SUBMIT, "cols": 0},
        {**SUBMIT, "rows": 201},
        {**SUBMIT, "idle_seconds": -1},
    ):
        answer = api.post("/executions", body)
        assert answer.status_code == 422 and problem(answer)["code"] == "validation_error", (body, answer.content)
    assert not Execution.objects.exists()
    for path in ("/executions?scope=has%20space", "/executions/lookup?scope=ci&id=-x"):
        assert api.get(path).status_code == 422
    pk = api.post("/executions", SUBMIT).json()["execution"]["id"]
    for query in ("wait=3601", "wait=nan", "wait=-1", "since=-1", "size=0"):
        answer = api.get(f"/executions/{pk}/output?{query}")
        assert answer.status_code == 422, (query, answer.content)
    assert api.get(f"/executions/{pk}/await?timeout=1e9").status_code == 422


@pytest.mark.django_db(transaction=True)  # the output endpoint is async: its own thread reaches the database
def test_a_query_parameter_the_operation_does_not_take_is_refused_by_name(api):
    """As the schema says (additionalProperties): `?wiat=30` was answered at once as if no wait was asked."""
    pk = api.post("/executions", SUBMIT).json()["execution"]["id"]
    for path, unknown in [
        (f"/executions/{pk}/output?wiat=30", ["wiat"]),
        (f"/executions/{pk}?since=0", ["since"]),
        ("/terminals?=false", [""]),
        ("/machines?x=1&y=2", ["x", "y"]),
    ]:
        answer = api.get(path)
        assert answer.status_code == 400, (path, answer.content)
        said = problem(answer)
        assert (said["code"], said["fields"]) == ("unknown_fields", unknown), said
    # What they do take is still taken (a fixed path is not mistaken for a templated one).
    assert api.get("/executions/lookup?scope=ci&id=job-1").status_code == 200
    assert api.get(f"/executions/{pk}/output?since=0&size=10&wait=0").status_code == 200


def test_too_many_query_parameters_are_a_problem_not_an_html_page(api):
    """Django refuses more than DATA_UPLOAD_MAX_NUMBER_FIELDS (1,000) fields: that was its HTML 400 page."""
    query = "&".join(f"p{n}=1" for n in range(1500))
    answer = api.get(f"/machines?{query}")
    assert answer.status_code == 400 and problem(answer)["code"] == "invalid_request", answer.content[:200]
    assert "1000" in problem(answer)["detail"]


def test_a_non_problem_refusal_keeps_its_status_as_a_problem(rf):
    """Any refusal under /api/ that is not a problem already is said as one, with its own status: a 409 or
    a 503 was turned into a 400 or a 500."""
    from django.http import HttpResponse

    from api.middleware import problems_only

    for status, code in ((409, "state_conflict"), (503, "internal_error"), (410, "gone"), (418, "invalid_request")):
        answer = problems_only(lambda request, status=status: HttpResponse("no", status=status))(rf.get("/api/v1/x"))
        assert answer["Content-Type"] == "application/problem+json"
        said = json.loads(answer.content)
        assert (answer.status_code, said["status"]) == (status, status), said
        assert said["code"] == code


def test_a_call_refused_before_its_token_was_read_is_audited_in_its_tokens_name(api):
    from api.models import ApiCall

    assert api.get("/machines?wiat=30").status_code == 400
    assert api.get("/machines?x=%00").status_code == 400
    calls = list(ApiCall.objects.order_by("id").values_list("token__name", "path", "status", "problem"))
    assert calls == [
        ("strict", "/api/v1/machines?wiat=30", 400, "unknown_fields"),
        ("strict", "/api/v1/machines?x=%00", 400, "invalid_request"),
    ], calls


def test_a_domain_refusal_of_a_field_lists_it_in_errors_as_the_schemas_do(api):
    too_long = api.post("/executions", {**SUBMIT, "argv": ["x" * 70_000]})
    said = problem(too_long)
    assert (too_long.status_code, said["code"]) == (422, "validation_error"), said
    assert said["errors"] == [{"field": "argv", "message": "longer than 65536 bytes"}], said


def test_a_body_that_is_not_sent_as_json_is_refused_and_runs_nothing(api):
    """A body sent as text/plain or form-encoded was read as JSON, though the schema takes application/json only."""
    import json as _json

    body = _json.dumps(SUBMIT)
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "application/xml"):
        answer = api.post("/executions", body, content_type=content_type)
        said = problem(answer)
        assert (answer.status_code, said["code"]) == (415, "unsupported_media_type"), said
        assert content_type in said["detail"]
    assert not Execution.objects.exists()
    assert api.post("/executions", body, content_type="application/json; charset=utf-8").status_code == 201

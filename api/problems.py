"""Errors as ``application/problem+json`` (RFC 9457) with a stable ``code`` a client can branch on.

Every refusal of the API is one of the codes below; the ``detail`` sentence says what happened in this
case, and extra members carry what a client needs to act (both digests, the failed checks, the wait).
"""

from __future__ import annotations

import json
import logging
from typing import Literal

from django.http import HttpResponse
from ninja import Schema
from pydantic import ConfigDict

log = logging.getLogger(__name__)

# code -> (status, title)
CODES: dict[str, tuple[int, str]] = {
    "invalid_request": (400, "The request is malformed"),
    "unknown_fields": (400, "The body has fields this operation does not take"),
    "unauthenticated": (401, "No valid API token"),
    "token_revoked": (401, "The API token was revoked"),
    "token_expired": (401, "The API token has expired"),
    "insufficient_scope": (403, "The token's scopes do not allow this"),
    "forbidden": (403, "Not allowed"),
    "path_refused": (403, "The machine does not allow files at that path"),
    "permission_denied": (403, "The machine's user may not read or write there"),
    "not_found": (404, "No such thing, or not yours"),
    "method_not_allowed": (405, "This path does not take that method"),
    "identity_conflict": (409, "That identity names a different execution"),
    "slot_taken": (409, "The machine's command slot is held"),
    "state_conflict": (409, "Its state does not allow this"),
    "resolve_refused": (409, "A resolution check failed"),
    "wrong_kind": (409, "The wrong kind of thing: a directory for a file (or back), a terminal's stderr or stdin"),
    "input_unconfirmed": (409, "That input's delivery is unconfirmed; it is not written again"),
    "input_gap": (409, "That input number skips one: send the expected one first"),
    "input_conflict": (409, "That input number was sent before with other keys"),
    "not_writer": (409, "Another window writes into this shell"),
    "gone": (410, "It was kept for its retention period, which has passed"),
    "too_large": (413, "The request is too large"),
    "unsupported_media_type": (415, "The body's media type is not one this operation takes"),
    "offset_out_of_range": (416, "That offset is past the end of the output"),
    "validation_error": (422, "A field is not valid"),
    "file_failed": (422, "The machine could not move the file (what it said is in detail)"),
    "rate_limited": (429, "Too many calls with this token"),
    "internal_error": (500, "Tether failed to answer; the failure is logged"),
    "owner_unavailable": (503, "No worker holds the process right now"),
}

PROBLEM_TYPE = "https://tether.invalid/problems/"


class ApiProblem(Exception):
    def __init__(
        self, code: str, detail: str, *, retry_after: int | None = None, as_status: int | None = None, **extra
    ):
        """``as_status``: another status than the code's (a refusal made elsewhere, said as a problem)."""
        super().__init__(detail)
        self.code, self.detail, self.retry_after, self.extra = code, detail, retry_after, extra
        self.status = as_status or CODES[code][0]


def field_error(message: str) -> dict:
    """A domain check's refusal ("argv: longer than …") as one of the ``errors`` a validation_error lists."""
    field, colon, said = message.partition(": ")
    return {"field": field, "message": said} if colon and " " not in field else {"field": "", "message": message}


def problem_body(problem: ApiProblem) -> dict:
    """Its RFC 9457 members (the API's answer, and what an MCP tool's error carries)."""
    status, title = problem.status, CODES[problem.code][1]
    body = {"type": PROBLEM_TYPE + problem.code, "title": title, "status": status, "code": problem.code}
    return body | {"detail": problem.detail, **problem.extra}


async def send_problem(send, problem: ApiProblem, *headers: tuple[bytes, bytes]) -> None:
    """The problem as a plain ASGI answer (before Django: the MCP endpoint, the upload size guard)."""
    said = [(b"content-type", b"application/problem+json"), (b"cache-control", b"no-store"), *headers]
    if problem.status == 401:
        said.append((b"www-authenticate", b'Bearer realm="tether"'))
    if problem.retry_after is not None:
        said.append((b"retry-after", str(problem.retry_after).encode()))
    await send({"type": "http.response.start", "status": problem.status, "headers": said})
    await send({"type": "http.response.body", "body": json.dumps(problem_body(problem)).encode()})


def problem_response(problem: ApiProblem) -> HttpResponse:
    status, title = problem.status, CODES[problem.code][1]
    response = HttpResponse(json.dumps(problem_body(problem)), status=status, content_type="application/problem+json")
    if problem.retry_after is not None:
        response["Retry-After"] = str(problem.retry_after)
    response.api_problem = problem.code  # for the audit line (api.middleware)
    if status >= 500 and problem.code != "internal_error":
        # An expected refusal (no worker holds the process): said at WARNING with its code, not as django.request's
        # ERROR "Service Unavailable", which pages whoever watches the errors.
        log.warning("%s answered %s %s: %s", problem.code, status, title, problem.detail)
        response._has_been_logged = True
    return response


# What any call with a token can be answered, whatever it does: a malformed request, a bad token, a missing
# scope, too large, a field not valid, too many calls.
COMMON = (
    "invalid_request", "unknown_fields", "unauthenticated", "token_revoked", "token_expired", "insufficient_scope",
    "too_large", "validation_error", "rate_limited", "internal_error",
)  # fmt: skip


class Problem(Schema):
    """An RFC 9457 problem: branch on ``code``; other members carry what a client needs to act."""

    model_config = ConfigDict(extra="allow")
    type: str
    title: str
    status: int
    code: Literal[tuple(CODES)]  # type: ignore[valid-type]
    detail: str


def answers(ok, *codes: str, raw: dict[int, dict] | None = None) -> dict:
    """An operation's documented answers: its successes (``ok``: a schema, or {status: schema}; ``raw``: {status:
    OpenAPI response} for one that is not JSON) and every problem it can give (the common ones and ``codes``),
    each status described by the codes it carries. Spread into the route's decorator:
    ``@router.get(path, **answers(Out, "not_found"))``."""
    response = dict(ok) if isinstance(ok, dict) else {200: ok} if ok is not None else {}
    response |= dict.fromkeys(raw or {})
    said: dict[int, list[str]] = {}
    for code in (*COMMON, *codes):
        status = CODES[code][0]
        response.setdefault(status, Problem)
        said.setdefault(status, []).append(code)
    described = {
        status: {"description": "; ".join(f"`{code}`: {CODES[code][1]}" for code in found)}
        for status, found in said.items()
    }
    return {"response": response, "openapi_extra": {"responses": {**(raw or {}), **described}}}

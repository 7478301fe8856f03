"""Every API call made with a known token is written down: which token, what, the answer, how long."""

from __future__ import annotations

import functools
import json
import logging
import re
import time

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.conf import settings
from django.core.exceptions import TooManyFieldsSent
from django.utils.decorators import sync_and_async_middleware

from api.models import ApiCall
from api.problems import CODES, ApiProblem, problem_response
from files.asgi import RAW_TYPES, is_upload

log = logging.getLogger(__name__)


def _record(request, response, started: float) -> None:
    token = getattr(request, "api_token", None)
    if token is None:
        return
    try:
        ApiCall.objects.create(
            token=token,
            method=request.method[:8],
            path=request.get_full_path().replace("\x00", "\\0")[:300],  # PostgreSQL text holds no NUL
            status=response.status_code,
            problem=getattr(response, "api_problem", "")[:40],
            milliseconds=min(int((time.monotonic() - started) * 1000), 2**31 - 1),
        )
    except Exception:  # the answer stands; a lost audit line is logged, never raised at the caller
        log.exception("could not audit %s %s", request.method, request.path)


@sync_and_async_middleware
def audit_api_calls(get_response):
    if iscoroutinefunction(get_response):

        async def middleware(request):
            started = time.monotonic()
            response = await get_response(request)
            if getattr(request, "api_token", None) is not None:
                await sync_to_async(_record)(request, response, started)
            return response

    else:

        def middleware(request):
            started = time.monotonic()
            response = get_response(request)
            _record(request, response, started)
            return response

    return middleware


API_PREFIX = "/api/"
_CODE_OF_STATUS = {
    400: "invalid_request", 401: "unauthenticated", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
    409: "state_conflict", 410: "gone", 413: "too_large", 429: "rate_limited",
}  # fmt: skip


@functools.cache
def _query_parameters() -> list[tuple[str, re.Pattern, frozenset[str]]]:
    """(method, path, the query parameters it takes) of every operation, as the schema says them."""
    from api.api import api

    found = []
    for path, operations in api.get_openapi_schema()["paths"].items():
        shape = re.compile("^" + re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(path)) + "$")
        for method, operation in operations.items():
            names = {p["name"] for p in operation.get("parameters", []) if p.get("in") == "query"}
            found.append((path.count("{"), method.upper(), shape, frozenset(names)))
    # A fixed path before a templated one it also matches (/executions/lookup before /executions/{pk}).
    return [entry[1:] for entry in sorted(found, key=lambda entry: entry[0])]


BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _has_body(request) -> bool:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0) > 0
    except ValueError:
        return True


def _is_json(content_type: str) -> bool:
    """application/json, or a JSON-based type (application/problem+json); its parameters aside."""
    return content_type == "application/json" or (
        content_type.startswith("application/") and content_type.endswith("+json")
    )


def _refused_before(request):
    """A NUL byte in the path or a query parameter (PostgreSQL cannot hold one; it was a 500), or a query
    parameter the operation does not take (a typo such as ``?wiat=30`` answered at once): refused first."""
    if "\x00" in request.path:
        return problem_response(ApiProblem("invalid_request", "the path holds a NUL byte"))
    try:
        request.GET  # noqa: B018 -- parsed here, where a refusal can still be said as a problem
    except TooManyFieldsSent:
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        return problem_response(ApiProblem("invalid_request", f"more than {limit} query parameters"))
    for name, values in request.GET.lists():
        if "\x00" in name or any("\x00" in value for value in values):
            shown = name.replace("\x00", "\\0")
            return problem_response(ApiProblem("invalid_request", f"query parameter {shown!r} holds a NUL byte"))
    if is_upload(request.method, request.path):  # a file's bytes, not JSON
        if request.content_type not in RAW_TYPES:
            said = request.content_type or "none"
            detail = f"the body's Content-Type is {said}; send application/octet-stream (a file) or application/x-tar"
            return problem_response(ApiProblem("unsupported_media_type", detail))
    elif request.method in BODY_METHODS and _has_body(request) and not _is_json(request.content_type):
        said = request.content_type or "none"
        detail = f"the body's Content-Type is {said}; send it as application/json"
        return problem_response(ApiProblem("unsupported_media_type", detail))
    if request.GET:
        for method, shape, names in _query_parameters():
            if method == request.method and shape.match(request.path):
                unknown = sorted(set(request.GET) - names)
                if unknown:
                    listed = ", ".join(repr(name) for name in unknown)
                    detail = f"this operation takes no query parameter {listed}"
                    return problem_response(ApiProblem("unknown_fields", detail, fields=unknown))
                break
    return None


def _as_problem(request, response):
    """Every answer under /api/ is the documented success or application/problem+json: Django's and ninja's own
    refusals (405 in HTML, a 400 with no body, a 404 page, a 500 page) are said as problems."""
    if response.status_code < 400 or response.get("Content-Type", "").startswith("application/problem+json"):
        return response
    status = response.status_code
    code = _CODE_OF_STATUS.get(status) or ("internal_error" if status >= 500 else "invalid_request")
    detail = ""
    if response.get("Content-Type", "").startswith("application/json"):
        try:
            detail = str(json.loads(response.content).get("detail", ""))
        except (ValueError, AttributeError):
            detail = ""
    if code == "method_not_allowed":
        detail = f"{request.method} is not taken here; allowed: {response.get('Allow', '')}"
    if code == "too_large":  # Django's words name its setting
        detail = f"the body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes"
    problem = problem_response(ApiProblem(code, detail or CODES[code][1], as_status=status))
    if response.has_header("Allow"):
        problem["Allow"] = response["Allow"]
    problem._has_been_logged = getattr(response, "_has_been_logged", False)
    return problem


def _audit_refused(request, response, started: float) -> None:
    """A call refused before its token was read (a NUL byte, an unknown query parameter) is audited as any other,
    in its token's name when it carries one of ours."""
    from api.auth import bearer_of
    from api.tokens import find_token

    raw = bearer_of(request)
    request.api_token = find_token(raw) if raw else None
    _record(request, response, started)


@sync_and_async_middleware
def problems_only(get_response):
    """Under /api/: a NUL byte in the path or query refused at once, and every refusal a problem."""
    if iscoroutinefunction(get_response):

        async def middleware(request):
            if not request.path.startswith(API_PREFIX):
                return await get_response(request)
            started = time.monotonic()
            if refused := _refused_before(request):
                await sync_to_async(_audit_refused)(request, refused, started)
                return refused
            return _as_problem(request, await get_response(request))

    else:

        def middleware(request):
            if not request.path.startswith(API_PREFIX):
                return get_response(request)
            started = time.monotonic()
            if refused := _refused_before(request):
                _audit_refused(request, refused, started)
                return refused
            return _as_problem(request, get_response(request))

    return middleware

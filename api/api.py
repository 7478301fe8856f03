"""The HTTP API at /api/v1/ (docs/api.md): one NinjaAPI, its token auth, and every error as a problem."""

from __future__ import annotations

from functools import wraps

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.openapi.docs import Swagger
from ninja.security import HttpBearer

from api.auth import authenticated, bearer_of, usable
from api.models import ApiToken
from api.problems import CODES, ApiProblem, field_error, problem_response
from api.schemas import PATTERN_WORDS, malformed
from api.tokens import find_token
from executions.errors import IdentityConflict, NotFound, Refused, SlotTaken, TransitionRefused, UsageError
from terminals.resolution import ResolveRefused


def signed_in_or_token(view):
    """The schema and its rendered docs: for people signed in (the docs in a browser) and for valid tokens."""

    @wraps(view)
    def guarded(request, *args, **kwargs):
        if request.user.is_authenticated or usable(find_token(bearer_of(request))) is None:
            return view(request, *args, **kwargs)
        if "html" in request.headers.get("Accept", ""):
            return redirect_to_login(request.get_full_path())
        return problem_response(ApiProblem("unauthenticated", "sign in, or send Authorization: Bearer tether_…"))

    return guarded


class TokenAuth(HttpBearer):
    """The bearer token of every API call (api/auth.py says when one is refused)."""

    def __call__(self, request):
        if not (raw := bearer_of(request)):
            raise ApiProblem("unauthenticated", "send the header Authorization: Bearer tether_…")
        return self.authenticate(request, raw)

    def authenticate(self, request, token: str) -> ApiToken:
        found, problem = authenticated(token)
        request.api_token = found  # known (even revoked): its call is audited
        if problem is not None:
            raise problem
        request.user = found.user
        return found


class OwnSwagger(Swagger):
    """ninja's Swagger page with its script and styles from Tether's static files. ninja is not an installed
    app (config/settings.py), and without one it would render the page that loads them from a CDN: its page
    for that case is given ninja's own template, which the template engine and static files find."""

    template_cdn = str(settings.NINJA_DIR / "templates" / "ninja" / "swagger.html")


class TetherApi(NinjaAPI):
    def get_openapi_schema(self, *, path_prefix=None, path_params=None):
        """Problems are documented as what they are: ``application/problem+json`` (ninja says application/json)."""
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                for status, answer in (operation.get("responses") or {}).items():
                    if int(status) >= 400 and "content" in answer:
                        answer["content"] = {"application/problem+json": answer["content"].pop("application/json")}
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                if "requestBody" in operation:  # a body that is not JSON: refused before it is read (api.middleware)
                    operation["responses"][415] = {
                        "description": f"`unsupported_media_type`: {CODES['unsupported_media_type'][1]}",
                        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
                    }
        _link(schema, "api_executions_submit", "/executions/{pk}", pk="$response.body#/execution/id")
        _link(
            schema, "api_terminals_open_terminal", "/terminals/{session_id}", session_id="$response.body#/terminal/id"
        )
        return schema


def _link(schema: dict, producer: str, under: str, **parameters: str) -> None:
    """OpenAPI links from ``producer``'s successes to every operation on a path under ``under`` (its id in
    their path): what a generated client, or a stateful test, calls next with what it was given."""
    consumers = {
        operation["operationId"]: operation
        for path, operations in schema.get("paths", {}).items()
        if path.split("/api/v1", 1)[-1].startswith(under)
        for operation in operations.values()
    }
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if operation.get("operationId") != producer:
                continue
            for status, answer in operation["responses"].items():
                if 200 <= int(status) < 300:
                    answer["links"] = {
                        name: {"operationId": name, "parameters": parameters} for name in sorted(consumers)
                    }


api = TetherApi(
    title="Tether API",
    version="1",
    description=(
        "Durable executions and terminal sessions for agents and scripts: idempotent submission, output by "
        "byte offset, numbered input written once, and `unknown` instead of a made-up exit. See docs/api.md."
    ),
    auth=TokenAuth(),
    urls_namespace="api",
    docs=OwnSwagger(),
    docs_decorator=signed_in_or_token,
)


@api.exception_handler(ApiProblem)
def _problem(request, error: ApiProblem):
    return problem_response(error)


def _field(item: dict) -> str:
    """A field's name as the caller wrote it (ninja puts the body's parameter name before it)."""
    where = [str(part) for part in item.get("loc", ())]
    return ".".join(where[2:] if where[:1] == ["body"] and len(where) > 2 else where)


def invalid(items: list[dict]) -> ApiProblem:
    """The problem of a request that does not fit its schema (pydantic's errors, ninja's or a tool's)."""
    for item in items:  # a body that is no object, or holds a NUL: malformed, said as such
        if malformed(cause := str((item.get("ctx") or {}).get("error", ""))):
            return ApiProblem("invalid_request", cause)
    unknown = [_field(item) for item in items if item.get("type") == "extra_forbidden"]
    if unknown:
        names = ", ".join(repr(name) for name in unknown)
        return ApiProblem("unknown_fields", f"this operation takes no field {names}", fields=unknown)
    errors = [{"field": _field(item), "message": _message(item)} for item in items]
    detail = "; ".join(f"{e['field']}: {e['message']}" if e["field"] else e["message"] for e in errors)
    return ApiProblem("validation_error", detail or "a field is not valid", errors=errors)


@api.exception_handler(ValidationError)
def _invalid(request, error: ValidationError):
    return problem_response(invalid(error.errors))


def _message(item: dict) -> str:
    """pydantic's message, with a pattern said in words (IDENTITY's, a machine name's, an absolute path...)."""
    pattern = (item.get("ctx") or {}).get("pattern")
    if item.get("type") == "string_pattern_mismatch" and pattern in PATTERN_WORDS:
        return f"must be {PATTERN_WORDS[pattern]}"
    return item.get("msg", "")


@api.exception_handler(AuthenticationError)
def _unauthenticated(request, error):
    return problem_response(ApiProblem("unauthenticated", "send the header Authorization: Bearer tether_…"))


@api.exception_handler(HttpError)
def _http(request, error: HttpError):
    code = {400: "invalid_request", 404: "not_found", 413: "too_large"}.get(error.status_code, "invalid_request")
    return problem_response(ApiProblem(code, str(error)))


@api.exception_handler(Http404)
def _missing(request, error):
    return problem_response(ApiProblem("not_found", "no such thing, or not yours"))


@api.exception_handler(RequestDataTooBig)
def _too_big(request, error):  # Django's words name its setting: said in the caller's terms
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return problem_response(ApiProblem("too_large", f"the body is larger than {limit} bytes", limit=limit))


def problem_of(error: Exception, token=None) -> ApiProblem | None:
    """The problem a refusal answers with, on every surface that speaks problems (this API's handlers, the MCP
    server's tools); None for an error that is no refusal. ``token``: whose call it was (a slot held by their
    own command is named to them, another user's never is)."""
    if isinstance(error, ApiProblem):
        return error
    if isinstance(error, NotFound):
        return ApiProblem("not_found", str(error))
    if isinstance(error, UsageError):
        return ApiProblem("validation_error", str(error), errors=[field_error(str(error))])
    if isinstance(error, IdentityConflict):
        return ApiProblem("identity_conflict", str(error))
    if isinstance(error, ResolveRefused):
        checks = [{"name": check.name, "ok": check.ok, "detail": check.detail} for check in error.checks]
        return ApiProblem("resolve_refused", str(error).splitlines()[0], checks=checks)
    if isinstance(error, SlotTaken):
        from api.seen import visible

        if token is not None and visible(token).filter(pk=error.holder_pk).exists():
            return ApiProblem("slot_taken", str(error), held_by=error.holder_label, held_state=error.holder_state)
        # Another user's: said as such, never by its name (scope and id are theirs).
        return ApiProblem("slot_taken", error.unnamed(), held_state=error.holder_state)
    if isinstance(error, TransitionRefused):
        return ApiProblem("state_conflict", str(error), state=error.current)
    if isinstance(error, Refused):
        return ApiProblem("forbidden", str(error))
    return None


def _refusal(request, error: Exception):
    return problem_response(problem_of(error, getattr(request, "auth", None)))


for _refused in (NotFound, UsageError, IdentityConflict, ResolveRefused, SlotTaken, TransitionRefused, Refused):
    api.add_exception_handler(_refused, _refusal)


from api import executions, inputs, output, terminals  # noqa: E402  (routers register on ``api``)
from files import api as files_api  # noqa: E402

api.add_router("/", executions.router)
api.add_router("/", output.router)
api.add_router("/", inputs.router)
api.add_router("/terminals", terminals.router)
api.add_router("/", files_api.router)

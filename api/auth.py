"""Who calls: the bearer token (its user, its scopes), refused with a problem when it cannot be used, and
counted against the token's rate limit. Free of django-ninja, so the WebSocket side (api/ws.py) loads without it;
the API's own ``TokenAuth`` is in api/api.py."""

from __future__ import annotations

import logging
import math
import time

from django.conf import settings
from django.core.cache import cache

from api.models import ApiToken
from api.problems import ApiProblem

log = logging.getLogger(__name__)


def usable(token: ApiToken | None) -> ApiProblem | None:
    """Why this token cannot be used now (a problem to answer with), or None."""
    if token is None:
        return ApiProblem("unauthenticated", "that is not a Tether API token (tether_…); make one on the Tokens page")
    if token.revoked_at is not None:
        return ApiProblem("token_revoked", f"token {token.name!r} was revoked")
    if token.ended == "expired":
        return ApiProblem("token_expired", f"token {token.name!r} expired at {token.expires_at.isoformat()}")
    if not token.user.is_active:
        return ApiProblem("unauthenticated", "the token's account is deactivated")
    return None


def check_rate(token: ApiToken) -> None:
    """At most TETHER_API_CALLS_PER_MINUTE calls a token in each clock minute, counted in the shared cache;
    one over is refused with 429 and Retry-After (the seconds to the next minute)."""
    limit = settings.TETHER_API_CALLS_PER_MINUTE
    now = time.time()
    key = f"api-rate:{token.prefix}:{int(now // 60)}"
    try:
        cache.add(key, 0, timeout=120)
        count = cache.incr(key)
    except Exception as error:  # the cache (Redis) away: the API goes on, uncounted, rather than stopping
        log.warning("API rate limit not counted: %r", error)
        return
    if count > limit:
        wait = max(1, math.ceil(60 - now % 60))
        raise ApiProblem("rate_limited", f"this token may make {limit} calls a minute", retry_after=wait, limit=limit)


def bearer_of(request) -> str:
    """The request's bearer token, "" when it sends none."""
    scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
    return raw.strip() if scheme.lower() == "bearer" else ""


def need(request, scope: str) -> ApiToken:
    """The call's token, when it has ``scope``; else 403 insufficient_scope."""
    token: ApiToken = request.auth
    if scope not in token.scopes:
        raise ApiProblem(
            "insufficient_scope", f"token {token.name!r} lacks the {scope!r} scope", needed=scope, scopes=token.scopes
        )
    return token


def authenticated(raw: str) -> tuple[ApiToken | None, ApiProblem | None]:
    """The token ``raw`` names, counted against its rate, or the problem to refuse the call with (with the token
    when it is known: a refused call of a known token is audited). Every surface's one check of a bearer token."""
    from api.tokens import find_token, note_used

    if not raw:
        return None, ApiProblem("unauthenticated", "send the header Authorization: Bearer tether_…")
    token = find_token(raw)
    if problem := usable(token):
        return token, problem
    try:
        check_rate(token)
    except ApiProblem as problem:
        return token, problem
    note_used(token)
    return token, None

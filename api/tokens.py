"""Making, finding and revoking API tokens. Each change is a compare-and-set with its audit event."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models.functions import Now
from django.utils import timezone

from access.policy import Do, may
from api.models import ApiToken, ApiTokenEvent, Scope
from executions.errors import NotFound, TransitionRefused, UsageError
from executions.labels import parse_label
from executions.models import Machine
from transport.layers import tell_group

TOKEN = re.compile(r"^tether_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
LAST_USED_EVERY = timedelta(seconds=30)  # last_used_at is written at most this often per token


def digest_of(raw: str) -> str:
    """What is kept of a token: its SHA-256 (the token itself is shown once, when it is made)."""
    return hashlib.sha256(raw.encode()).hexdigest()


def token_group(token_pk: int) -> str:
    """The channel-layer group of the sockets opened with this token: a revoke closes them."""
    return f"tether.apitoken.{token_pk}"


def create_token(
    user, *, name: str, scopes: list[str], days: int | None = None, actor=None, machines: list[str] | None = None,
    labels: list[str] | None = None,
) -> tuple[ApiToken, str]:  # fmt: skip
    """A new token for ``user``: (the record, the token itself, which is never shown again). ``machines`` and
    ``labels`` narrow it to those machines (names its user may reach now) and those labels (key=value)."""
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise UsageError("a token needs a name of 1-100 characters, saying what it is for")
    chosen = sorted(set(scopes or []))
    if not chosen or any(scope not in Scope.values for scope in chosen):
        raise UsageError(f"choose one or more scopes of {', '.join(Scope.values)}")
    days = settings.TETHER_API_TOKEN_DAYS if days is None else days
    if not isinstance(days, int) or not 1 <= days <= settings.TETHER_API_TOKEN_MAX_DAYS:
        raise UsageError(f"a token lasts 1 to {settings.TETHER_API_TOKEN_MAX_DAYS} days")
    machines, labels = _narrowed(user, machines or [], labels or [])
    prefix = secrets.token_hex(6)
    raw = f"tether_{prefix}_{secrets.token_urlsafe(32)}"
    try:
        with transaction.atomic():
            token = ApiToken.objects.create(
                user=user,
                name=name,
                prefix=prefix,
                digest=digest_of(raw),
                scopes=chosen,
                machines=machines,
                labels=labels,
                expires_at=timezone.now() + timedelta(days=days),
            )
            by = actor or user
            ApiTokenEvent.objects.create(
                token=token, kind="created", actor=f"user:{by.get_username()}", user=by, reason=", ".join(chosen)
            )
    except IntegrityError:
        raise UsageError(f"you already have a token named {name!r}; revoke it or choose another name") from None
    return token, raw


def _narrowed(user, machines: list[str], labels: list[str]) -> tuple[list[str], list[str]]:
    """The machine names and labels a token is limited to, checked: a machine its user cannot reach is refused
    as one that does not exist; a label is any well-formed key=value (one that matches nothing is allowed)."""
    names = sorted({name.strip() for name in machines if name.strip()})
    for name in names:
        machine = Machine.objects.filter(name=name).first()
        if machine is None or not may(user, Do.SEE, machine):
            raise UsageError(f"no machine {name!r} you may reach")
    kept = sorted({"=".join(parse_label(text.strip())) for text in labels if text.strip()})
    return names, kept


def find_token(raw: str) -> ApiToken | None:
    """The token this string is, whatever its state; None when it is no token of ours."""
    match = TOKEN.match(raw or "")
    if match is None:
        return None
    token = ApiToken.objects.select_related("user").filter(prefix=match.group(1)).first()
    if token is None or not hmac.compare_digest(token.digest, digest_of(raw)):
        return None
    return token


def note_used(token: ApiToken) -> None:
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=Now())
        token.last_used_at = now


def revoke_token(token_pk: int, *, by, reason: str = "") -> ApiToken:
    """Revoke at once: refused calls from now on, and every socket opened with it closed. Compare-and-set:
    of two revokes, one wins and the other is told it was already revoked."""
    token = ApiToken.objects.select_related("user").filter(pk=token_pk).first()
    if token is None:
        raise NotFound(f"no API token {token_pk}")
    with transaction.atomic():
        changed = ApiToken.objects.filter(pk=token_pk, revoked_at__isnull=True).update(
            revoked_at=Now(), revoked_by=by, revoke_reason=reason[:500]
        )
        if changed != 1:
            raise TransitionRefused(f"token {token.name}", "revoked", "revoked", "it was already revoked")
        ApiTokenEvent.objects.create(
            token=token, kind="revoked", actor=f"user:{by.get_username()}", user=by, reason=reason[:500]
        )
    transaction.on_commit(lambda: _close_sockets(token_pk))
    token.refresh_from_db()
    return token


def _close_sockets(token_pk: int) -> None:
    tell_group(token_group(token_pk), {"type": "token.revoked"}, f"API token {token_pk}'s sockets it was revoked")

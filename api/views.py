"""The Tokens page of the portal: make a token (shown once), see yours and what they did last, revoke one."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from api.models import ApiToken, Scope
from api.tokens import create_token, revoke_token
from executions.errors import ExecutionError

DAYS = (1, 7, 30, 90, 365)


def _page(request: HttpRequest, *, status: int = 200, **context) -> HttpResponse:
    tokens = ApiToken.objects.filter(user=request.user).prefetch_related("calls")[:100]
    context = {
        "tokens": tokens,
        "scopes": Scope.choices,
        "days": [d for d in DAYS if d <= settings.TETHER_API_TOKEN_MAX_DAYS],
        "default_days": settings.TETHER_API_TOKEN_DAYS,
        "now": timezone.now(),
        "api_base": request.build_absolute_uri("/api/v1/"),
        **context,
    }
    template = "api/tokens.html#token-panel" if request.htmx else "api/tokens.html"
    return render(request, template, context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest) -> HttpResponse:
    """Your API tokens (GET), or a new one (POST: ``name``, ``scopes``, ``days``; ``machines`` and ``labels`` to
    narrow it, separated by commas or spaces), shown this once."""
    if request.method == "GET":
        return _page(request)
    raw_days = request.POST.get("days", "")
    try:
        days = int(raw_days) if raw_days.isdigit() else -1
        token, raw = create_token(
            request.user, name=request.POST.get("name", ""), scopes=request.POST.getlist("scopes"), days=days,
            machines=_words(request.POST.get("machines", "")), labels=_words(request.POST.get("labels", "")),
        )  # fmt: skip
    except ExecutionError as refused:
        return _page(request, error=str(refused), status=400)
    return _page(request, new_token=token, new_raw=raw)


@login_required
@require_POST
def revoke(request: HttpRequest, pk: int) -> HttpResponse:
    token = ApiToken.objects.filter(pk=pk, user=request.user).first()
    if token is None:
        raise Http404("No such token of yours")
    try:
        revoke_token(pk, by=request.user, reason=request.POST.get("reason", "")[:500] or "revoked on the Tokens page")
    except ExecutionError as refused:
        return _page(request, error=str(refused))
    return _page(request, revoked=token)


def _words(text: str) -> list[str]:
    return [word for word in text.replace(",", " ").split() if word]

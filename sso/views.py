"""The sign-in's pages: the start (to the provider), the way back (the code exchanged, the person signed in),
and a clear page when it is refused: why, and what to do. A refused sign-in creates no one."""

from __future__ import annotations

import logging

import requests
from django.conf import settings
from django.contrib import auth
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from sso.backend import FAILURE_KEY
from sso.discovery import ProviderUnreachable, endpoint_setting

log = logging.getLogger(__name__)


def _failed(request: HttpRequest, why: str, *, sign_out: bool = True) -> HttpResponse:
    """A refused sign-in, said on its page. A refused re-check of a signed-in person (their provider session
    ended, their groups claim gone or malformed) signs them out: what they had ends with it."""
    if sign_out and request.user.is_authenticated:
        auth.logout(request)  # the session is flushed (its sockets close): the reason is written after
    request.session[FAILURE_KEY] = why
    return redirect("sso:failed")


class SignIn(OIDCAuthenticationRequestView):
    get_settings = staticmethod(endpoint_setting)

    def __init__(self, *args, **kwargs):
        try:
            super().__init__(*args, **kwargs)
        except ProviderUnreachable as error:
            self.unreachable = str(error)
        else:
            self.unreachable = ""

    def get(self, request):
        if self.unreachable:
            return _failed(request, self.unreachable)
        return super().get(request)


class Callback(OIDCAuthenticationCallbackView):
    get_settings = staticmethod(endpoint_setting)

    def get(self, request):
        if request.GET.get("error") and request.GET.get("state") not in request.session.get("oidc_states", {}):
            # Not the answer to a sign-in this browser started (a link from anywhere): nobody is signed out.
            return _failed(request, "the sign-in could not be completed; start again", sign_out=False)
        try:
            return super().get(request)
        except SuspiciousOperation as refused:
            # A code used already (or a stale page of the flow), a token that does not verify, a wrong issuer.
            why = str(refused) if request.session.get(FAILURE_KEY) is None else request.session[FAILURE_KEY]
            if "state not found" in why:
                why = "this sign-in was used already or has expired; start again"
            return _failed(request, why)
        except (requests.RequestException, ProviderUnreachable) as error:
            # The provider refused the code (used twice, expired) or could not be reached.
            log.warning("single sign-on: the provider refused or failed: %r", error)
            return _failed(request, "the identity provider did not accept this sign-in; start again")

    def login_failure(self):
        why = self.request.session.get(FAILURE_KEY)
        if not why and self.request.GET.get("error"):
            why = (
                f"the identity provider said: {self.request.GET.get('error_description') or self.request.GET['error']}"
            )
        return _failed(self.request, why or "the sign-in could not be completed; start again")


@require_GET
def failed(request: HttpRequest) -> HttpResponse:
    why = request.session.pop(FAILURE_KEY, "") or "the sign-in could not be completed"
    context = {"why": why, "passwords": settings.TETHER_OIDC_PASSWORDS, "provider": settings.TETHER_OIDC_NAME}
    return render(request, "sso/failed.html", context, status=403)

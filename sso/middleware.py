"""A single sign-on session lives no longer than the provider's: every ``TETHER_OIDC_SESSION_SECONDS`` the page's
next request goes to the provider without a prompt; a provider session that ended answers with an error, and
the callback signs the person out (their sockets close: terminals.signals). Password sessions are not touched."""

from __future__ import annotations

import logging

from django.core.exceptions import ImproperlyConfigured
from django.urls import reverse
from django.utils.functional import cached_property
from mozilla_django_oidc.middleware import SessionRefresh as OidcSessionRefresh

from sso.discovery import ProviderUnreachable, endpoint_setting

log = logging.getLogger(__name__)


class _Refresh(OidcSessionRefresh):
    get_settings = staticmethod(endpoint_setting)

    @cached_property
    def exempt_urls(self) -> set[str]:
        """The sign-in's own pages, and signing out."""
        return {reverse(name) for name in ("sso:start", "sso:callback", "sso:failed", "logout")}


class SessionRefresh:
    sync_capable, async_capable = True, False

    def __init__(self, get_response):
        self.get_response = get_response
        self._refresh: _Refresh | None = None  # it reads the provider's endpoints: not before a sign-in needs them

    def __call__(self, request):
        if request.user.is_authenticated and "oidc_id_token_expiration" in request.session:
            try:
                self._refresh = self._refresh or _Refresh(self.get_response)
                refreshed = self._refresh.process_request(request)
            except (ProviderUnreachable, ImproperlyConfigured) as error:
                # The provider away: the page is served, never a 500; the re-check comes at the next request.
                log.warning("single sign-on: the session could not be checked with the provider now: %s", error)
                refreshed = None
            if refreshed is not None:
                return refreshed
        return self.get_response(request)

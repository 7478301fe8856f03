"""The provider's endpoints, read from its discovery document (``ISSUER/.well-known/openid-configuration``) when
first needed and kept for an hour: configuring Tether takes the issuer only, and a provider that is down at
start does not stop Tether from starting (its sign-in says so when it is used)."""

from __future__ import annotations

import threading
import time

import requests
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

KEPT_SECONDS = 3600
ENDPOINTS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
    "OIDC_OP_LOGOUT_ENDPOINT": "end_session_endpoint",
}
_lock = threading.Lock()
_found: dict = {}


class ProviderUnreachable(Exception):
    """The identity provider's discovery document could not be read."""


def document() -> dict:
    with _lock:
        issuer = settings.TETHER_OIDC_ISSUER
        if _found.get("issuer") == issuer and time.monotonic() - _found["at"] < KEPT_SECONDS:
            return _found["document"]
        try:
            answer = requests.get(f"{issuer}/.well-known/openid-configuration", timeout=10)
            answer.raise_for_status()
            found = answer.json()
        except (requests.RequestException, ValueError) as error:
            raise ProviderUnreachable(f"the identity provider at {issuer} could not be reached: {error}") from None
        if found.get("issuer", "").rstrip("/") != issuer:
            raise ImproperlyConfigured(f"the provider says its issuer is {found.get('issuer')!r}, not {issuer!r}")
        _found.update(document=found, at=time.monotonic(), issuer=issuer)
        return found


def endpoint_setting(attr: str, *default):
    """``get_settings`` for mozilla-django-oidc: the OP's endpoints from discovery, the rest from settings."""
    if attr in ENDPOINTS:
        return document().get(ENDPOINTS[attr], *default) if default else document()[ENDPOINTS[attr]]
    from mozilla_django_oidc.utils import import_from_settings

    return import_from_settings(attr, *default)

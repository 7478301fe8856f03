"""What the log-in page offers: single sign-on (its provider's name) and, unless it is turned off, passwords."""

from __future__ import annotations

from django.conf import settings


def sign_in(request) -> dict:
    on = bool(settings.TETHER_OIDC_ISSUER)
    return {"sso": settings.TETHER_OIDC_NAME if on else "", "passwords": not on or settings.TETHER_OIDC_PASSWORDS}

"""Signing in with the company's identity provider (OpenID Connect, mozilla-django-oidc's code flow with PKCE).

A person is known by the provider's issuer and subject (``sso.models.Identity``), never by an email. At every
sign-in their groups are taken from the groups claim (``TETHER_OIDC_GROUPS_CLAIM``), through
``TETHER_OIDC_GROUP_MAP`` when it is set, so a person taken out of a team at the provider loses its grants at
their next sign-in (and when their provider session ends, their Tether session does too:
``sso.middleware``). Anything unexpected refuses the sign-in with a clear page and writes nothing: a claim of
the wrong type or missing, another issuer or audience, an expired token, a name a local account has."""

from __future__ import annotations

import logging
import time

import jwt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from sso.discovery import endpoint_setting
from sso.models import Identity

log = logging.getLogger(__name__)
FAILURE_KEY = "sso_failure"  # the session's note of why the last sign-in was refused


class Refused(SuspiciousOperation):
    """A sign-in refused: its text is what the person is told."""


def group_map() -> dict[str, str]:
    """``TETHER_OIDC_GROUP_MAP``: "provider-group=tether-group,..." as a dict (empty: names taken as they are)."""
    pairs = [part.strip() for part in settings.TETHER_OIDC_GROUP_MAP.split(",") if part.strip()]
    return dict(pair.split("=", 1) for pair in pairs if "=" in pair)


def wanted_groups(claimed: list[str]) -> set[str]:
    mapping = group_map()
    return {mapping[name] for name in claimed if name in mapping} if mapping else set(claimed)


def sync_groups(user, claimed: list[str]) -> None:
    """The user's groups as the provider says: with a map, only the mapped groups are the provider's to set
    (others, given in Tether, stay); without one, all of them are."""
    mapping = group_map()
    wanted = wanted_groups(claimed)
    managed = user.groups.filter(name__in=set(mapping.values())) if mapping else user.groups.all()
    gone = [group for group in managed if group.name not in wanted]
    if gone:
        user.groups.remove(*gone)  # access.signals: what they gave ends now
    have = set(user.groups.values_list("name", flat=True))
    user.groups.add(*(Group.objects.get_or_create(name=name)[0] for name in sorted(wanted - have)))


class SsoBackend(OIDCAuthenticationBackend):
    get_settings = staticmethod(endpoint_setting)

    def refuse(self, why: str):
        request = getattr(self, "request", None)
        if request is not None:
            request.session[FAILURE_KEY] = why
            request.session.save()
        log.warning("single sign-on refused: %s", why)
        raise Refused(why)

    def _verify_jws(self, payload, key):
        """mozilla-django-oidc's, with a leeway for the provider's clock (``TETHER_OIDC_LEEWAY_SECONDS``): without
        one, a provider 300 ms ahead had about one sign-in in three refused as "not yet valid (iat)"."""
        alg = jwt.get_unverified_header(payload).get("alg")
        if alg != self.OIDC_RP_SIGN_ALGO:
            raise SuspiciousOperation(f"The provider algorithm {alg!r} does not match the client's OIDC_RP_SIGN_ALGO.")
        try:
            return jwt.decode(
                payload, key, algorithms=[alg], options={"verify_aud": False},
                leeway=settings.TETHER_OIDC_LEEWAY_SECONDS,
            )  # fmt: skip
        except jwt.DecodeError:
            raise SuspiciousOperation("JWS token verification failed.") from None

    def verify_token(self, token, **kwargs):
        try:
            payload = super().verify_token(token, **kwargs)  # its signature (the provider's keys) and its nonce
        except jwt.ExpiredSignatureError:  # PyJWT checks exp itself: a provider whose clock is behind ours
            self.refuse("the sign-in has expired; start again")
        except jwt.InvalidTokenError as error:  # not valid yet (a clock ahead), a claim of the wrong type
            self.refuse(f"the provider's token could not be accepted ({error}); start again")
        issuer, client = settings.TETHER_OIDC_ISSUER, settings.TETHER_OIDC_CLIENT_ID
        leeway = settings.TETHER_OIDC_LEEWAY_SECONDS
        if str(payload.get("iss", "")).rstrip("/") != issuer:
            self.refuse(f"the sign-in came from another issuer ({payload.get('iss')!r}), not {issuer}")
        audience = payload.get("aud")
        if client not in (audience if isinstance(audience, list) else [audience]):
            self.refuse("the sign-in was not for Tether (its audience is another application)")
        if not isinstance(payload.get("exp"), int | float) or payload["exp"] < time.time() - leeway:
            self.refuse("the sign-in has expired; start again")
        self.payload = payload
        return payload

    def verify_claims(self, claims) -> bool:
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject or subject != getattr(self, "payload", {}).get("sub"):
            self.refuse("the provider named nobody (no subject, or not the one it signed)")
        name = claims.get(settings.TETHER_OIDC_USERNAME_CLAIM)
        if not isinstance(name, str) or not name.strip() or len(name) > 150:
            self.refuse(f"the provider's {settings.TETHER_OIDC_USERNAME_CLAIM!r} claim is missing or not a name")
        groups = claims.get(settings.TETHER_OIDC_GROUPS_CLAIM)
        if groups is None:
            self.refuse(f"the provider sent no {settings.TETHER_OIDC_GROUPS_CLAIM!r} claim, which says your teams")
        if not isinstance(groups, list) or not all(isinstance(g, str) and 0 < len(g) <= 150 for g in groups):
            self.refuse(f"the provider's {settings.TETHER_OIDC_GROUPS_CLAIM!r} claim is not a list of names")
        return True

    def get_user(self, user_id):
        """A deactivated person is nobody, whatever session they hold."""
        user = super().get_user(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None

    def filter_users_by_claims(self, claims):
        found = Identity.objects.filter(issuer=settings.TETHER_OIDC_ISSUER, subject=claims["sub"])
        return get_user_model().objects.filter(sso_identity__in=found)

    def create_user(self, claims):
        name = claims[settings.TETHER_OIDC_USERNAME_CLAIM].strip()
        users = get_user_model().objects
        with transaction.atomic():  # the user, who they are at the provider and their groups, or nothing
            if users.filter(**{get_user_model().USERNAME_FIELD: name}).exists():
                self.refuse(f"a Tether account named {name!r} exists already and is not this sign-in's")
            user = users.create_user(name, email=claims.get("email") or "", password=None)
            Identity.objects.create(user=user, issuer=settings.TETHER_OIDC_ISSUER, subject=claims["sub"])
            sync_groups(user, claims[settings.TETHER_OIDC_GROUPS_CLAIM])
        return user

    def update_user(self, user, claims):
        with transaction.atomic():
            if (email := claims.get("email")) and email != user.email:
                get_user_model().objects.filter(pk=user.pk).update(email=email)
            sync_groups(user, claims[settings.TETHER_OIDC_GROUPS_CLAIM])
            Identity.objects.filter(user=user).update(last_login_at=timezone.now())
        return user

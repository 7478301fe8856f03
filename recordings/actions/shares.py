"""Share links: a read-only, expiring, revocable link to a live session (its holder watches as an observer) or
to a recording, for logged-in users. Only the token's SHA-256 is stored; making, opening and revoking one are
audited on the session, and revoking one closes the sockets opened through it at once."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from enum import StrEnum

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from executions.actions import Actor
from executions.errors import Refused, UsageError
from recordings.models import Recording, RecordingState, ShareLink
from terminals.actions.permissions import may_share
from terminals.actions.sessions import session_event
from terminals.models import TerminalSession
from transport.layers import tell_group


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def may_revoke_share(user, link: ShareLink) -> bool:
    """Who made it, the session's owner, or staff with the permission to revoke any link."""
    if not (user.is_authenticated and user.is_active):
        return False
    mine = user.pk in (link.created_by_id, link.session.user_id)
    return mine or (user.is_staff and user.has_perm("recordings.revoke_sharelink"))


def share_group(link_pk: int) -> str:
    """The channel group of the sockets opened through a link (closed together when it is revoked)."""
    return f"tether.share.{link_pk}"


def create_share_link(
    user, session: TerminalSession, *, recording: Recording | None = None, seconds: int | None = None
) -> tuple[ShareLink, str]:
    """A new link to ``session`` live, or to one of its recordings; returns it and its token (shown once)."""
    if not may_share(user, session):
        raise Refused("you may not share this session")
    if recording is not None and recording.session_id != session.pk:
        raise UsageError("that recording is not this session's")
    if recording is not None and recording.state != RecordingState.SAVED:
        # A recording still being made would go on showing the shell: that is the live link's to do.
        raise UsageError("a recording is shared once its shell has ended; share the live shell to show it now")
    seconds = settings.TETHER_SHARE_LINK_SECONDS if seconds is None else seconds
    longest = settings.TETHER_SHARE_LINK_MAX_SECONDS
    if not 60 <= seconds <= longest:
        raise UsageError(f"a share link lasts from 60 to {longest} seconds, not {seconds}")
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        link = ShareLink.objects.create(
            token_hash=token_hash(token),
            session=session,
            recording=recording,
            created_by=user,
            expires_at=timezone.now() + timedelta(seconds=seconds),
        )
        what = f"recording of generation {recording.generation}" if recording else "the live session"
        session_event(
            session, "share_created", Actor.for_user(user), f"a share link to {what}, for {seconds // 60} min",
            share_link=link.pk, shares=link.kind, expires_at=link.expires_at.isoformat(),
        )  # fmt: skip
    return link, token


def valid_share_link(token: str) -> ShareLink | None:
    """The link ``token`` opens, when it is neither revoked nor expired (on the database's clock)."""
    if not isinstance(token, str) or not 20 <= len(token) <= 100:
        return None
    link = (
        ShareLink.objects.select_related(
            "session__machine", "session__user", "session__execution", "recording", "created_by"
        )
        .filter(token_hash=token_hash(token), revoked_at__isnull=True, expires_at__gt=Now())
        .first()
    )
    if link is None:
        return None
    # Whoever made it must still be allowed to: a link outlives no deactivation or lost permission, and once
    # withdrawn it stays so (the maker's access coming back does not bring back a link they may have forgotten).
    if not may_share(link.created_by, link.session):
        withdraw_share_link(link)
        return None
    return link


class LinkEnd(StrEnum):
    """Why a share link no longer opens anything."""

    OPEN = ""  # it still does
    REVOKED = "revoked"
    EXPIRED = "expired"  # on the database's clock
    WITHDRAWN = "withdrawn"  # its maker may no longer share the session


def link_ended(link_pk: int) -> LinkEnd:
    """Why a link no longer opens anything (``LinkEnd.OPEN``, which is falsy, while it still does)."""
    link = ShareLink.objects.select_related("created_by", "session").annotate(now=Now()).filter(pk=link_pk).first()
    if link is None:
        return LinkEnd.REVOKED
    if link.revoked_at is not None:
        withdrawn = link.session.events.filter(kind="share_withdrawn", detail__share_link=link.pk).exists()
        return LinkEnd.WITHDRAWN if withdrawn else LinkEnd.REVOKED
    if link.expires_at <= link.now:
        return LinkEnd.EXPIRED
    if may_share(link.created_by, link.session):
        return LinkEnd.OPEN
    withdraw_share_link(link)
    return LinkEnd.WITHDRAWN


def withdraw_share_link(link: ShareLink) -> None:
    """Revoke a link whose maker lost the right to share its session (compare-and-set, audited, its sockets
    closed): revoked by its maker's loss, as if they had revoked it."""
    with transaction.atomic():
        changed = ShareLink.objects.filter(pk=link.pk, revoked_at__isnull=True).update(
            revoked_at=Now(), revoked_by=link.created_by
        )
        if changed:
            why = f"{link.created_by} may no longer watch this shell"
            session_event(link.session, "share_withdrawn", Actor("access"), why, share_link=link.pk)
            transaction.on_commit(lambda: _close_sockets(link.pk, "share.withdrawn"))


def note_share_opened(link: ShareLink, user) -> None:
    with transaction.atomic():
        ShareLink.objects.filter(pk=link.pk).update(opened=F("opened") + 1)
        session_event(
            link.session, "share_opened", Actor.for_user(user), f"opened a share link of {link.created_by}",
            share_link=link.pk, shares=link.kind,
        )  # fmt: skip


def revoke_share_link(link_pk: int, user, *, reason: str = "") -> ShareLink:
    """Revoke a link now (compare-and-set: revoking twice is one revocation); its open sockets close."""
    link = ShareLink.objects.select_related("session__user").filter(pk=link_pk).first()
    if link is None or not may_revoke_share(user, link):
        raise Refused("no such share link of yours")
    with transaction.atomic():
        changed = ShareLink.objects.filter(pk=link_pk, revoked_at__isnull=True).update(
            revoked_at=Now(), revoked_by=user
        )
        if not changed:
            raise Refused("that share link was revoked already")
        session_event(link.session, "share_revoked", Actor.for_user(user), reason or "revoked", share_link=link_pk)
        transaction.on_commit(lambda: _close_sockets(link_pk))
    link.refresh_from_db()
    return link


def _close_sockets(link_pk: int, why: str = "share.revoked") -> None:
    tell_group(share_group(link_pk), {"type": why}, f"share link {link_pk}'s sockets it was {why[6:]}")


def share_links_of(session: TerminalSession, user) -> list[ShareLink]:
    """The session's links ``user`` may see (and revoke): theirs, or all of them for its owner and staff who
    may revoke any."""
    links = ShareLink.objects.filter(session=session).select_related("created_by", "recording", "revoked_by")
    return [link for link in links[:50] if may_revoke_share(user, link)]

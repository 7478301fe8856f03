"""The WebSocket of a share link to a live session: a logged-in user watches it as an observer, read-only,
until the link is revoked (its sockets are told at once, and each one checks its link every few seconds
should that message be lost) or expires."""

from __future__ import annotations

import asyncio
import logging

from channels.db import database_sync_to_async as db
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from recordings import actions
from terminals.consumers import TerminalConsumer
from terminals.models import TerminalSession
from terminals.protocol import Reason, Via

log = logging.getLogger(__name__)

ENDS = {
    "revoked": (Reason.SHARE_REVOKED, "This share link was revoked"),
    "expired": (Reason.SHARE_EXPIRED, "This share link has expired"),
    "withdrawn": (Reason.SHARE_REVOKED, "This share link no longer works: whoever made it may no longer share"),
}


def _link_session(token: str):
    link = actions.valid_share_link(token)
    if link is None or link.recording_id is not None:
        return None, None
    return link, link.session


class SharedTerminalConsumer(TerminalConsumer):
    read_only = True

    async def load_session(self, user) -> TerminalSession | None:
        self.link, session = await db(_link_session)(self.scope["url_route"]["kwargs"]["token"])
        return session

    @property
    def via(self) -> Via:
        return Via.SHARE_LINK

    def still_allowed(self) -> str:
        """A link's holder needs no permission of their own (the link is checked by ``_watch_link``), only a
        live account."""
        user = get_user_model().objects.filter(pk=self.user.pk, is_active=True).first()
        return "" if user is not None else "This account was deactivated"

    async def connected(self) -> None:
        self.link_group = actions.share_group(self.link.pk)
        await self.channel_layer.group_add(self.link_group, self.channel_name)
        self.tasks.start(self._watch_link(), name="link_check")

    async def _leave(self) -> None:
        await super()._leave()
        if group := getattr(self, "link_group", None):
            self.link_group = None
            await self.channel_layer.group_discard(group, self.channel_name)

    async def _watch_link(self) -> None:
        """Close at the link's expiry; and check now and then that it was not revoked meanwhile."""
        while True:
            left = (self.link.expires_at - timezone.now()).total_seconds()
            # At least a moment: this clock may run ahead of the database's, which decides.
            await asyncio.sleep(max(0.5, min(left, settings.TETHER_VIEWER_CHECK_SECONDS)))
            try:
                ended = await db(actions.link_ended)(self.link.pk)
            except Exception as error:  # the database is away: expiry by this clock, revocation by message
                log.info("share link %s: cannot check it now (%r)", self.link.pk, error)
                ended = "expired" if self.link.expires_at <= timezone.now() else ""
            if ended:
                await self.end_for(*ENDS[ended])
                return

    async def access_changed(self, event: dict) -> None:
        """The link's maker (or this watcher) may have lost access: the link is checked again now."""
        if why := await db(self.still_allowed)():
            await self.not_allowed(why)
        elif ended := await db(actions.link_ended)(self.link.pk):
            await self.end_for(*ENDS[ended])

    async def share_revoked(self, event: dict) -> None:
        await self.end_for(*ENDS["revoked"])

    async def share_withdrawn(self, event: dict) -> None:
        await self.end_for(*ENDS["withdrawn"])

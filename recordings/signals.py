"""The recordings app's answer to a change of access: a share link dies when its maker may no longer watch
what it shows, and the sockets opened through the others check their right again at once."""

from __future__ import annotations

from django.dispatch import receiver

from access.signals import access_changed
from recordings.actions.shares import share_group, withdraw_share_link
from recordings.models import ShareLink
from terminals.actions.permissions import may_share
from transport.layers import tell_group


@receiver(access_changed)
def end_what_lost_access(sender, users, **kwargs) -> None:
    if users is None:  # every socket, those of share links too, was told by terminals/signals.py
        return
    links = ShareLink.objects.filter(created_by__in=users, revoked_at__isnull=True).select_related(
        "created_by", "session__machine"
    )
    for link in links:
        if not may_share(link.created_by, link.session):
            withdraw_share_link(link)  # for good, whether or not a socket is open through it (its sockets told)
        else:
            message = {"type": "access.changed"}
            tell_group(share_group(link.pk), message, f"share link {link.pk}'s sockets that its maker's access changed")

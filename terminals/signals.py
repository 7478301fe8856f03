"""The terminals app's answers to other apps' signals: a submission wakes the owner workers; logging out
closes that user's terminal sockets at once, wherever they are connected."""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth.signals import user_logged_out
from django.dispatch import Signal, receiver

from access.signals import access_changed
from executions.signals import execution_submitted
from terminals.wake import wake_workers

log = logging.getLogger(__name__)

# Sent by the owner worker (on its database thread) before it writes an API client's numbered input, with
# ``claim`` (the number's record). A receiver answering False means it must not be written: the client was
# told it was never written, and may send it again.
api_input_taken = Signal()


@receiver(execution_submitted)
def wake_on_submission(sender, execution, **kwargs) -> None:
    wake_workers()


@receiver(user_logged_out)
def close_terminal_sockets(sender, request, user, **kwargs) -> None:
    if user is None:
        return
    try:
        async_to_sync(get_channel_layer().group_send)(f"tether.user.{user.pk}", {"type": "user.logged_out"})
    except Exception as error:  # Redis away: each socket's periodic check notices the deleted session
        log.warning("could not tell %s's sockets about the logout: %r", user, error)


ACCESS_GROUP = "tether.access"  # every terminal socket: told when anyone's access may have narrowed


@receiver(access_changed)
def close_what_lost_access(sender, users, **kwargs) -> None:
    """Each socket of these users checks its right again at once (None: every socket). The sockets opened
    through their share links are told by the recordings app (recordings/signals.py)."""
    from transport.layers import tell_group

    message = {"type": "access.changed"}
    if users is None:
        tell_group(ACCESS_GROUP, message, "every socket that access changed")
        return
    for pk in users:
        tell_group(f"tether.user.{pk}", message, f"user {pk}'s sockets that their access changed")

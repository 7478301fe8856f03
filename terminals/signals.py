"""The terminals app's answers to other apps' signals: a submission wakes the owner workers; logging out
closes that user's terminal sockets at once, wherever they are connected."""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth.signals import user_logged_out
from django.dispatch import receiver

from executions.signals import execution_submitted
from terminals.wake import wake_workers

log = logging.getLogger(__name__)


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

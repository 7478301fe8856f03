"""Who may have lost access, said at once: a grant changed or taken away, a user taken out of a group or
deactivated, a group deleted, a machine's labels changed. The apps above listen (terminals closes the sockets
that lost their right, the share links whose maker lost it); every socket and long poll also checks again
on its own, so a lost message only delays the end."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models.signals import m2m_changed, post_save, pre_delete
from django.dispatch import Signal, receiver

from access.fence import narrowing
from executions.signals import machine_labels_changed

# Sent after a change committed, with ``users``: the pks of the users whose access may have narrowed, or None
# for anyone (a machine's labels changed: whatever was granted through them).
access_changed = Signal()


def members(group_pk: int | None) -> set[int]:
    if group_pk is None:
        return set()
    return set(get_user_model().objects.filter(groups=group_pk).values_list("pk", flat=True))


def _tell(users: set[int] | None) -> None:
    if users is None or users:
        transaction.on_commit(lambda: access_changed.send_robust(Group, users=users))


@receiver(m2m_changed, sender=get_user_model().groups.through)
def groups_changed(sender, instance, action, reverse, pk_set, **kwargs) -> None:
    """A user out of a group (``user.groups.remove``, or ``group.user_set.remove``)."""
    if action in ("pre_remove", "pre_clear"):
        narrowing()  # inside the removal's own transaction (Django's related managers open one)
    if action == "pre_clear":
        # Who is in it is known only before the clear.
        instance._tether_cleared = members(instance.pk) if reverse else {instance.pk}
    elif action == "post_clear":
        _tell(getattr(instance, "_tether_cleared", set()))
    elif action == "post_remove":
        _tell(set(pk_set or ()) if reverse else {instance.pk})


@receiver(pre_delete, sender=Group)
def group_deleted(sender, instance, **kwargs) -> None:
    narrowing()  # inside the deletion's transaction
    _tell(members(instance.pk))


@receiver(post_save, sender=get_user_model())
def user_saved(sender, instance, created, **kwargs) -> None:
    if not created and not instance.is_active:
        _tell({instance.pk})


@receiver(machine_labels_changed)
def labels_changed(sender, machine, before, **kwargs) -> None:
    if set((before or {}).items()) - set((machine.labels or {}).items()):
        access_changed.send_robust(Group, users=None)

"""Who may have lost access, said at once: a grant changed or taken away, a user taken out of a group or
deactivated, a group deleted, a machine's labels changed, a permission taken from a person or a group, a person no
longer staff or superuser. The apps above listen (terminals closes the sockets
that lost their right, the share links whose maker lost it); every socket and long poll also checks again
on its own, so a lost message only delays the end."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models.signals import m2m_changed, post_save, pre_delete, pre_save
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


@receiver(m2m_changed, sender=get_user_model().user_permissions.through)
def permissions_of_a_person_changed(sender, instance, action, reverse, pk_set, **kwargs) -> None:
    """A permission taken from a person (``user.user_permissions.remove``, or ``permission.user_set.remove``):
    staff reach every workspace through one, without a grant."""
    if action in ("pre_remove", "pre_clear"):
        narrowing()
    if action == "pre_clear":
        instance._tether_cleared = set(instance.user_set.values_list("pk", flat=True)) if reverse else {instance.pk}
    elif action == "post_clear":
        _tell(getattr(instance, "_tether_cleared", set()))
    elif action == "post_remove":
        _tell(set(pk_set or ()) if reverse else {instance.pk})


@receiver(m2m_changed, sender=Group.permissions.through)
def permissions_of_a_group_changed(sender, instance, action, reverse, pk_set, **kwargs) -> None:
    """A permission taken from a group (``group.permissions.remove``, or ``permission.group_set.remove``): its
    members lose what it gave them."""
    if action in ("pre_remove", "pre_clear"):
        narrowing()
    if action == "pre_clear":
        groups = set(instance.group_set.values_list("pk", flat=True)) if reverse else {instance.pk}
        instance._tether_cleared = set().union(*(members(pk) for pk in groups))
    elif action == "post_clear":
        _tell(getattr(instance, "_tether_cleared", set()))
    elif action == "post_remove":
        groups = set(pk_set or ()) if reverse else {instance.pk}
        _tell(set().union(*(members(pk) for pk in groups)))


@receiver(pre_delete, sender=Group)
def group_deleted(sender, instance, **kwargs) -> None:
    narrowing()  # inside the deletion's transaction
    _tell(members(instance.pk))


@receiver(pre_save, sender=get_user_model())
def user_saving(sender, instance, update_fields=None, **kwargs) -> None:
    """Whether this save takes something away: staff or superuser no more (the row's update is fenced: an act
    deciding reads the person's row FOR SHARE)."""
    if instance.pk is None or (update_fields is not None and not {"is_staff", "is_superuser"} & set(update_fields)):
        return  # a sign-in's last_login, say: nothing of access
    was = get_user_model().objects.filter(pk=instance.pk).values("is_staff", "is_superuser").first() or {}
    instance._tether_narrowed = (was.get("is_staff") and not instance.is_staff) or (
        was.get("is_superuser") and not instance.is_superuser
    )


@receiver(post_save, sender=get_user_model())
def user_saved(sender, instance, created, **kwargs) -> None:
    if not created and (not instance.is_active or getattr(instance, "_tether_narrowed", False)):
        _tell({instance.pk})


@receiver(machine_labels_changed)
def labels_changed(sender, machine, before, **kwargs) -> None:
    if set((before or {}).items()) - set((machine.labels or {}).items()):
        access_changed.send_robust(Group, users=None)

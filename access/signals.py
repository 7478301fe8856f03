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


def _narrowed_by_removals(through, holder: str, far: str, people) -> None:
    """A many-to-many that gives access (a person's groups, a person's or a group's permissions): a removal or a
    clear is fenced (inside its own transaction: Django's related managers open one) and told to ``people(pks)``,
    the people who held it through the ``holder`` side's rows, from either side of the relation."""

    def changed(sender, instance, action, reverse, pk_set, **kwargs) -> None:
        if action in ("pre_remove", "pre_clear"):
            narrowing()
        if action == "pre_clear":  # who held it is known only before the clear
            held = (
                sender.objects.filter(**{far: instance.pk}).values_list(holder, flat=True) if reverse else [instance.pk]
            )
            instance._tether_cleared = people(set(held))
        elif action == "post_clear":
            _tell(getattr(instance, "_tether_cleared", set()))
        elif action == "post_remove":
            _tell(people(set(pk_set or ()) if reverse else {instance.pk}))

    m2m_changed.connect(changed, sender=through, weak=False)


def _members_of(groups: set[int]) -> set[int]:
    return set().union(*(members(pk) for pk in groups))


# Out of a group (``user.groups.remove``, ``group.user_set.remove``); a permission taken from a person (staff reach
# every workspace through one, without a grant) or from a group (its members lose what it gave them).
_narrowed_by_removals(get_user_model().groups.through, "user_id", "group_id", set)
_narrowed_by_removals(get_user_model().user_permissions.through, "user_id", "permission_id", set)
_narrowed_by_removals(Group.permissions.through, "group_id", "permission_id", _members_of)


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

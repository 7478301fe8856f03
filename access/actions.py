"""Granting and taking away access: every change a compare-and-set with its audit event naming who did it, and
once it commits, everyone whose access it may have narrowed is told (their open sockets and long polls check
again at once: ``access.signals.access_changed``)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction

from access.fence import narrowing
from access.models import Grant, GrantEvent, Role
from access.signals import access_changed, members
from executions.actions import Actor
from executions.errors import NotFound, Refused, UsageError
from executions.labels import parse_label
from executions.models import Machine, MachineState


def find_user(name: str):
    user = get_user_model().objects.filter(**{get_user_model().USERNAME_FIELD: name}).first()
    if user is None:
        raise NotFound(f"no user named {name!r}")
    return user


def find_group(name: str) -> Group:
    group = Group.objects.filter(name=name).first()
    if group is None:
        raise NotFound(f"no group named {name!r}")
    return group


def find_machine(name: str) -> Machine:
    machine = Machine.objects.exclude(state=MachineState.DELETED).filter(name=name).first()
    if machine is None:
        raise NotFound(f"no machine named {name!r}")
    return machine


def _selector(*, user=None, group=None, machine=None, label: str | None = None) -> dict:
    if (user is None) == (group is None):
        raise UsageError("a grant is to exactly one user or one group")
    if (machine is None) == (label is None):
        raise UsageError("a grant is on exactly one machine or one label (key=value)")
    key, value = parse_label(label) if label is not None else ("", "")
    return {"user": user, "group": group, "machine": machine, "label_key": key, "label_value": value}


def _event(kind: str, grant: Grant, actor: Actor, role: str = "", was: str = "", reason: str = "") -> None:
    GrantEvent.objects.create(
        kind=kind, subject=grant.subject, target=grant.target, machine_id=grant.machine_id,
        label_key=grant.label_key, label_value=grant.label_value, role=role, was=was, actor=actor.label,
        user=actor.user, reason=reason,
    )  # fmt: skip


def _told(grant: Grant) -> None:
    users = {grant.user_id} if grant.user_id else members(grant.group_id)
    transaction.on_commit(lambda: access_changed.send_robust(Grant, users=users))


def matching(key: str, value: str) -> list[Machine]:
    """The machines (not deleted) carrying ``key=value`` now."""
    found = Machine.objects.exclude(state=MachineState.DELETED).order_by("name")
    return [machine for machine in found if (machine.labels or {}).get(key) == value]


def grant(
    *, role: str, actor: Actor, user=None, group=None, machine: Machine | None = None, label: str | None = None,
    note: str = "",
) -> tuple[Grant, str]:  # fmt: skip
    """Give ``role`` to a user or a group, on a machine or a label. Returns the grant and what happened:
    "granted", "changed" (another role before: the event names both) or "unchanged"."""
    if role not in Role.values:
        raise UsageError(f"role must be one of {', '.join(Role.values)}, not {role!r}")
    selector = _selector(user=user, group=group, machine=machine, label=label)
    with transaction.atomic():
        existing = Grant.objects.select_for_update(of=("self",)).filter(**selector).order_by("pk").first()
        if existing is not None:
            if existing.role == role:
                return existing, "unchanged"
            was = existing.role
            if Grant.objects.filter(pk=existing.pk, role=was).update(role=role) != 1:
                raise Refused(f"{existing} changed meanwhile; look again")
            existing.role = role
            narrowing()  # a lower role may take away what an open in flight relies on
            _event("changed", existing, actor, role=role, was=was, reason=note)
            _told(existing)  # a lower role ends what the higher one allowed
            return existing, "changed"
        try:
            with transaction.atomic():
                made = Grant.objects.create(**selector, role=role, created_by=actor.label, note=note)
        except IntegrityError:
            raise Refused("the same grant was made meanwhile; look again") from None
        _event("granted", made, actor, role=role, reason=note)
    return made, "granted"


def revoke(
    *, actor: Actor, user=None, group=None, machine: Machine | None = None, label: str | None = None, reason: str = ""
) -> Grant:
    """Take a grant away (its holders' open sockets on what it reached close, their long polls end)."""
    selector = _selector(user=user, group=group, machine=machine, label=label)
    with transaction.atomic():
        existing = Grant.objects.select_for_update(of=("self",)).filter(**selector).order_by("pk").first()
        if existing is None:
            raise NotFound("no such grant")
        narrowing()  # an open deciding now commits first (and is closed with the rest), or sees this
        _event("revoked", existing, actor, was=existing.role, reason=reason)
        _told(existing)
        Grant.objects.filter(pk=existing.pk).delete()
    return existing


def revoke_grant(grant_pk: int, *, actor: Actor, reason: str = "") -> Grant:
    """The same, for a grant known by its number (the admin)."""
    existing = Grant.objects.select_related("user", "group", "machine").filter(pk=grant_pk).first()
    if existing is None:
        raise NotFound("no such grant")
    label = f"{existing.label_key}={existing.label_value}" if existing.label_key else None
    return revoke(
        actor=actor, user=existing.user, group=existing.group, machine=existing.machine, label=label, reason=reason
    )

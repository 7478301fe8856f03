"""Who may reach which workspace: grants of a role on a machine, or on every machine carrying a label, to a
user or a group (a team). Without a grant a workspace does not exist for that person (docs/access.md)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models
from django.db.models import Q

from executions.models import AppendOnly, Machine


class Role(models.TextChoices):
    """``use`` is one's own shells and commands; others' are for ``watch`` (read-only) and ``operate``."""

    WATCH = "watch", "watch: see it, watch its shells read-only, play its recordings"
    USE = "use", "use: see it, open a shell, run commands (one's own)"
    OPERATE = "operate", "operate: use and watch, and Kill, Reset, Dismiss others' shells and commands"

    @property
    def rank(self) -> int:
        return RANKS[self]


RANKS = {Role.WATCH: 1, Role.USE: 2, Role.OPERATE: 3}


class Grant(models.Model):
    """A role for a user or a group, on one machine or on every machine whose labels carry ``label``."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="grants"
    )
    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.CASCADE, related_name="grants")
    machine = models.ForeignKey(Machine, null=True, blank=True, on_delete=models.CASCADE, related_name="grants")
    label_key = models.CharField(max_length=63, blank=True)
    label_value = models.CharField(max_length=63, blank=True)
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=200, help_text="user:NAME or command:NAME")
    note = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["machine__name", "label_key", "label_value", "group__name", "user__username"]
        constraints = [
            models.CheckConstraint(
                condition=Q(user__isnull=False, group__isnull=True) | Q(user__isnull=True, group__isnull=False),
                name="grant_to_a_user_or_a_group",
            ),
            models.CheckConstraint(
                condition=Q(machine__isnull=False, label_key="", label_value="")
                | (Q(machine__isnull=True) & ~Q(label_key="") & ~Q(label_value="")),
                name="grant_on_a_machine_or_a_label",
            ),
            models.CheckConstraint(condition=Q(role__in=["watch", "use", "operate"]), name="grant_role_valid"),
            models.UniqueConstraint(
                fields=["user", "machine"], condition=Q(user__isnull=False, machine__isnull=False),
                name="grant_once_user_machine",
            ),
            models.UniqueConstraint(
                fields=["group", "machine"], condition=Q(group__isnull=False, machine__isnull=False),
                name="grant_once_group_machine",
            ),
            models.UniqueConstraint(
                fields=["user", "label_key", "label_value"], condition=Q(user__isnull=False, machine__isnull=True),
                name="grant_once_user_label",
            ),
            models.UniqueConstraint(
                fields=["group", "label_key", "label_value"], condition=Q(group__isnull=False, machine__isnull=True),
                name="grant_once_group_label",
            ),
        ]  # fmt: skip
        permissions = [
            ("use_every_workspace", "Can open shells and run commands on every workspace, granted or not (staff)"),
            ("operate_every_workspace", "Can kill, reset and dismiss on every workspace, granted or not (staff)"),
        ]

    def __str__(self) -> str:
        return f"{self.role} for {self.subject} on {self.target}"

    @property
    def subject(self) -> str:
        return f"user {self.user.get_username()}" if self.user_id else f"group {self.group.name}"

    @property
    def target(self) -> str:
        return f"machine {self.machine.name}" if self.machine_id else f"label {self.label_key}={self.label_value}"


class GrantEvent(AppendOnly):
    """A grant made, changed or taken away: who did it (``actor``), what (``detail``: subject, target, roles)."""

    kind = models.CharField(max_length=16)  # granted, changed, revoked
    subject = models.CharField(max_length=200)
    target = models.CharField(max_length=200)
    machine = models.ForeignKey(Machine, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    label_key = models.CharField(max_length=63, blank=True)
    label_value = models.CharField(max_length=63, blank=True)
    role = models.CharField(max_length=16, blank=True)
    was = models.CharField(max_length=16, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.role or self.was} for {self.subject} on {self.target}"

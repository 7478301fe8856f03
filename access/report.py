"""Who can reach a workspace, and why: every active user with a role on it, each with the grants (direct, through
a group, through a label) or the staff permission that gives it. The admin's "Who can reach this workspace" page
and ``manage.py access_report`` show it; nothing here writes."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model

from access.policy import Reach
from executions.models import Machine


@dataclass(frozen=True)
class Reached:
    username: str
    role: str
    why: tuple[str, ...]


def why_of(reach: Reach, machine: Machine) -> tuple[str, ...]:
    reasons = []
    if reach.superuser:
        reasons.append("superuser")
    elif (permitted := reach.permitted()) is not None:
        reasons.append(f"staff permission ({permitted})")
    for grant in reach.granted(machine):
        through = f"group {grant.group.name}" if grant.group_id else "a grant to them"
        on = "the machine" if grant.machine_id else f"label {grant.label_key}={grant.label_value}"
        reasons.append(f"{grant.role} on {on}, through {through}")
    return tuple(reasons)


def who_can_reach(machine: Machine) -> list[Reached]:
    found = []
    for user in get_user_model().objects.filter(is_active=True).order_by(get_user_model().USERNAME_FIELD):
        reach = Reach(user)
        if role := reach.role(machine):
            found.append(Reached(user.get_username(), role, why_of(reach, machine)))
    return found

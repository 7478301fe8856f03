"""Who may open, view and take over which shell. Pure checks: nothing here writes."""

from __future__ import annotations

from django.conf import settings

from executions.models import Backend, Machine
from terminals.models import TerminalSession


def may_use_machine(user, machine: Machine) -> bool:
    """Host shells (local, tmux) are staff-only unless settings allow everyone."""
    if not user.is_authenticated or not user.is_active:
        return False
    if machine.backend in {Backend.LOCAL, Backend.TMUX} and not settings.TETHER_HOST_SHELLS_FOR_ALL:
        return user.is_staff
    return True


TAKEOVER_PERMISSION = "terminals.takeover_terminalsession"


def may_view_session(user, session: TerminalSession) -> bool:
    """Its owner, or staff allowed to take over another user's shell (which the user is then told)."""
    if not (user.is_authenticated and user.is_active):
        return False
    return session.user_id == user.pk or may_take_over(user, session)


def may_take_over(user, session: TerminalSession) -> bool:
    return session.user_id != user.pk and user.is_staff and user.has_perm(TAKEOVER_PERMISSION)


def in_use_refusal(machine: Machine, session: TerminalSession, user) -> str:
    """Why ``user`` may not open ``machine``'s open shell, in their words."""
    if user.is_staff:
        return (
            f"{machine.name} has {session.user.get_username()}'s shell open; writing into another user's shell "
            'needs the permission "Can write into another user\'s shell"'
        )
    return f"{machine.name} is in use by another user's shell right now"

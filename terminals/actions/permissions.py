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
OBSERVE_PERMISSION = "terminals.observe_terminalsession"


def may_view_session(user, session: TerminalSession) -> bool:
    """Its owner, or staff allowed to watch another user's shell (they open it as an observer) or to take it
    over (which the user is then told). Its recordings follow the same rule."""
    if not (user.is_authenticated and user.is_active):
        return False
    return session.user_id == user.pk or may_observe(user, session)


def may_observe_others(user) -> bool:
    """Staff who may watch other users' shells read-only (and play their recordings): with the permission to
    watch, or to take over."""
    staff = user.is_authenticated and user.is_staff and user.is_active
    return staff and (user.has_perm(OBSERVE_PERMISSION) or user.has_perm(TAKEOVER_PERMISSION))


def may_observe(user, session: TerminalSession) -> bool:
    return session.user_id != user.pk and may_observe_others(user)


def may_take_over(user, session: TerminalSession) -> bool:
    return session.user_id != user.pk and user.is_staff and user.is_active and user.has_perm(TAKEOVER_PERMISSION)


def may_share(user, session: TerminalSession) -> bool:
    """Its owner, or staff who may watch it and make share links."""
    if not (user.is_authenticated and user.is_active):
        return False
    return session.user_id == user.pk or (may_observe(user, session) and user.has_perm("terminals.add_sharelink"))


def may_revoke_share(user, link) -> bool:
    """Who made it, the session's owner, or staff with the permission to revoke any link."""
    if not (user.is_authenticated and user.is_active):
        return False
    mine = user.pk in (link.created_by_id, link.session.user_id)
    return mine or (user.is_staff and user.has_perm("terminals.revoke_sharelink"))


def in_use_refusal(machine: Machine, session: TerminalSession, user) -> str:
    """Why ``user`` may not open ``machine``'s open shell, in their words."""
    if user.is_staff:
        return (
            f"{machine.name} has {session.user.get_username()}'s shell open; watching another user's shell needs "
            'the permission "Can watch another user\'s shell and play its recordings"'
        )
    return f"{machine.name} is in use by another user's shell right now"

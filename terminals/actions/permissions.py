"""Who may open, view, take over and share which shell: the terminals' words for the one decision
(access.policy.may). Pure checks: nothing here writes."""

from __future__ import annotations

from access.policy import TAKEOVER_PERMISSION, Do, may
from executions.models import Machine
from terminals.models import TerminalSession

OBSERVE_PERMISSION = "terminals.observe_terminalsession"

__all__ = ["OBSERVE_PERMISSION", "TAKEOVER_PERMISSION"]


def may_see_machine(user, machine: Machine) -> bool:
    """Whether the workspace exists for ``user`` at all (any role on it)."""
    return may(user, Do.SEE, machine)


def may_use_machine(user, machine: Machine) -> bool:
    """Open a shell on it, run commands there."""
    return may(user, Do.USE, machine)


def may_view_session(user, session: TerminalSession) -> bool:
    """Its own user with use, or anyone who may watch the machine's shells (they open it as an observer), or
    take it over (the user is told). Its recordings follow the same rule."""
    return may(user, Do.USE, session) or may(user, Do.WATCH, session)


def may_observe(user, session: TerminalSession) -> bool:
    """Watch another user's shell read-only."""
    return session.user_id != user.pk and may(user, Do.WATCH, session)


def may_take_over(user, session: TerminalSession) -> bool:
    return may(user, Do.TAKE_OVER, session)


def may_share(user, session: TerminalSession) -> bool:
    """Make a share link to it: whoever may watch it (the link gives no more than that)."""
    return may(user, Do.SHARE, session)


def may_operate(user, session: TerminalSession) -> bool:
    """Reset, kill or dismiss it: its own user (with use), or an operator of its machine."""
    return may(user, Do.OPERATE, session)


def in_use_refusal(machine: Machine, session: TerminalSession, user) -> str:
    """Why ``user`` may not open ``machine``'s open shell: someone else's is open, and they may not watch it (so
    whose it is is not theirs to know)."""
    return f"{machine.name} is in use by another user's shell right now"

"""The one decision of who may do what to which workspace, shell, recording or command (docs/access.md).

Every surface asks ``may(who, do, target)``: the portal's pages, the terminal and share sockets, the API and its
token socket, the MCP tools, the admin's actions and the staff commands. ``who`` is a user or an API token (a
token is its user narrowed to its machines and labels, never widened); ``target`` a machine, or something of
one (a terminal session, a recording, a share link, an execution). Nothing here writes.

A machine is reachable through a grant (to the user, or to a group the user is in; on the machine, or on a
label it carries) with a role: ``watch`` (see, watch its shells), ``use`` (see, one's own shells and
commands), ``operate`` (both, and end or reset others' work). Staff reach machines with no grant only with
the matching permission; a superuser reaches everything. Host shells (local, tmux) are staff-only unless a
grant names the machine itself and ``TETHER_HOST_SHELLS_FOR_ALL`` allows it.
"""

from __future__ import annotations

from enum import StrEnum

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist
from django.db.models import Q

from access.models import RANKS, Grant, Role
from executions.models import Backend, Machine, MachineState

HOST_BACKENDS = frozenset({Backend.LOCAL, Backend.TMUX})
WATCH_PERMISSIONS = ("terminals.observe_terminalsession", "terminals.takeover_terminalsession")
USE_PERMISSION = "access.use_every_workspace"
OPERATE_PERMISSION = "access.operate_every_workspace"
TAKEOVER_PERMISSION = "terminals.takeover_terminalsession"
RESOLVE_PERMISSION = "executions.resolve_execution"


class Do(StrEnum):
    """What someone asks to do."""

    SEE = "see"  # know it exists: listed, its state read
    WATCH = "watch"  # watch a shell read-only beside its writer, play recordings
    USE = "use"  # open a shell, write into one's own, run commands, read one's own commands' output
    OPERATE = "operate"  # kill, reset, dismiss: others' shells and commands too
    TAKE_OVER = "take_over"  # write into another user's shell (they are told; audited)
    SHARE = "share"  # make a share link (it gives watch of one shell or recording, no more)
    RESOLVE = "resolve"  # resolve an unknown outcome (staff with the permission, after Tether's checks)


# What each role lets one do on a machine. ``use`` is one's own shells and commands; watching others' shells is
# ``watch``'s (or ``operate``'s, which ends and resets them): a teammate with ``use`` does not see yours.
CAN = {
    Role.WATCH: frozenset({Do.SEE, Do.WATCH}),
    Role.USE: frozenset({Do.SEE, Do.USE}),
    Role.OPERATE: frozenset({Do.SEE, Do.WATCH, Do.USE, Do.OPERATE}),
}


def said(roles: set[Role]) -> str:
    """Roles in a person's words: "operate", "use, watch", "" for none."""
    if Role.OPERATE in roles:
        return Role.OPERATE
    return ", ".join(sorted(roles, key=RANKS.__getitem__, reverse=True))


class Reach:
    """One person's (or token's) reach, read once: their grants and permissions, evaluated per machine."""

    def __init__(self, user, token=None):
        self.user, self.token = user, token
        self.active = bool(user is not None and user.is_authenticated and user.is_active)
        self.superuser = self.active and user.is_superuser
        self.staff = self.active and user.is_staff
        self._grants: list[Grant] | None = None

    def grants(self) -> list[Grant]:
        if self._grants is None:
            if not self.active:
                self._grants = []
            else:
                mine = Q(user=self.user) | Q(group__in=self.user.groups.all())
                self._grants = list(Grant.objects.filter(mine).select_related("machine", "group", "user"))
        return self._grants

    def granted(self, machine: Machine) -> list[Grant]:
        """The grants that reach ``machine`` (host shells: for non-staff only those naming it, if allowed)."""
        host_shell = machine.backend in HOST_BACKENDS and not self.staff
        if host_shell and not settings.TETHER_HOST_SHELLS_FOR_ALL:
            return []
        labels = machine.labels or {}
        found = []
        for grant in self.grants():
            if grant.machine_id is not None:
                if grant.machine_id == machine.pk:
                    found.append(grant)
            elif not host_shell and labels.get(grant.label_key) == grant.label_value:
                found.append(grant)
        return found

    def permitted(self) -> Role | None:
        """The role staff permissions give on every machine (none for others)."""
        if self.superuser:
            return Role.OPERATE
        if not self.staff:
            return None
        if self.user.has_perm(OPERATE_PERMISSION):
            return Role.OPERATE
        if self.user.has_perm(USE_PERMISSION):
            return Role.USE
        if any(self.user.has_perm(permission) for permission in WATCH_PERMISSIONS):
            return Role.WATCH
        return None

    def roles(self, machine: Machine | None) -> set[Role]:
        """The roles on ``machine``, none when it does not exist for them (deleted, ungranted, outside the token)."""
        if machine is None or not self.active or machine.state == MachineState.DELETED:
            return set()
        if self.token is not None and not token_allows(self.token, machine):
            return set()
        found = {Role(grant.role) for grant in self.granted(machine)}
        if (permitted := self.permitted()) is not None:
            found.add(permitted)
        return found

    def role(self, machine: Machine | None) -> str:
        """The roles on ``machine`` in a person's words ("" for none)."""
        return said(self.roles(machine))

    def may(self, do: Do, target) -> bool:
        if not self.active:
            return False
        machine, owner_id = where(target)
        if do == Do.RESOLVE:
            allowed = self.staff and self.user.has_perm(RESOLVE_PERMISSION)
            return allowed and (self.token is None or machine is None or token_allows(self.token, machine))
        can = frozenset().union(*(CAN[role] for role in self.roles(machine)))
        mine = owner_id is None or owner_id == self.user.pk
        if do == Do.USE:
            return mine and Do.USE in can
        if do == Do.WATCH:
            # One's own shell one may always watch while one may see the machine (from another window).
            return Do.WATCH in can or (owner_id is not None and mine and Do.USE in can)
        if do == Do.OPERATE:
            # One's own shell or command is one's own to reset or end with ``use``.
            return Do.OPERATE in can or (owner_id is not None and mine and Do.USE in can)
        if do == Do.TAKE_OVER:
            if mine or not self.user.has_perm(TAKEOVER_PERMISSION):
                return False
            return Do.SEE in can and (self.staff or Do.USE in can)
        if do == Do.SHARE:  # a share link gives watch of one shell: only who may watch it makes one
            return self.may(Do.WATCH, target)
        return do in can

    def machines(self, do: Do = Do.SEE):
        """The machines they may ``do`` to (not deleted), by name."""
        found = Machine.objects.exclude(state=MachineState.DELETED).order_by("name")
        return [machine for machine in found if self.may(do, machine)]


def token_allows(token, machine: Machine) -> bool:
    """A token limited to named machines or labels reaches only those (its user's grants still decide)."""
    names, labels = list(getattr(token, "machines", None) or []), list(getattr(token, "labels", None) or [])
    if not names and not labels:
        return True
    carried = {f"{key}={value}" for key, value in (machine.labels or {}).items()}
    return machine.name in names or bool(carried & set(labels))


def where(target) -> tuple[Machine | None, int | None]:
    """The machine a target is on, and whose it is (None: a machine itself, or nobody's)."""
    if target is None or isinstance(target, Machine):
        return target, None
    if hasattr(target, "session") and hasattr(target, "token_hash"):  # a share link
        target = target.recording or target.session
    if hasattr(target, "session") and not hasattr(target, "process_state"):  # a recording
        target = target.session
    if hasattr(target, "process_state"):  # a terminal session
        return target.machine, target.user_id
    if hasattr(target, "spec_digest"):  # an execution: its shell's user's, or its submitter's
        try:
            owner = target.terminal_session.user_id
        except ObjectDoesNotExist:  # not a shell's
            owner = target.requested_by_id
        return target.machine, owner
    raise TypeError(f"no machine for {type(target).__name__}")


def reach_of(who) -> Reach:
    """A user's reach, or an API token's (its user, narrowed to the token's machines and labels)."""
    if isinstance(who, Reach):
        return who
    if hasattr(who, "digest") and hasattr(who, "scopes"):  # an API token
        return Reach(who.user, who)
    return Reach(who)


def may(who, do: Do, target) -> bool:
    """Whether ``who`` (a user or an API token) may ``do`` this to ``target``. A target they may not reach is
    answered by every surface as one that does not exist."""
    return reach_of(who).may(Do(do), target)


def machine_named(who, name: str, do: Do = Do.SEE) -> Machine | None:
    """The machine ``name`` when ``who`` may ``do`` to it; else None, as for a name nothing carries. Either way
    after the same work (the decision is asked of a stand-in when there is no such machine), so that how long the
    answer takes does not confirm a guessed name."""
    machine = Machine.objects.filter(name=name).exclude(state=MachineState.DELETED).first()
    asked = machine if machine is not None else Machine(name=name, backend=Backend.DOCKER, labels={})
    allowed = may(who, do, asked)
    return machine if machine is not None and allowed else None


def role_on(who, machine: Machine) -> str:
    """Their roles there, in a person's words ("" when it does not exist for them)."""
    return reach_of(who).role(machine)

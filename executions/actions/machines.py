"""Registering machines, moving their state, and noting what they stand for (their placement)."""

from __future__ import annotations

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Now

from executions.actions.common import MACHINE_NAME, Actor, check_identity, normal_path, raise_slot_refusal
from executions.errors import IdentityConflict, TransitionRefused, UsageError
from executions.labels import parse_labels, said
from executions.models import (
    Backend,
    Execution,
    Machine,
    MachineEvent,
    MachineState,
)
from executions.signals import machine_labels_changed

MACHINE_TRANSITIONS: dict[str, frozenset[str]] = {
    MachineState.RUNNING: frozenset({MachineState.STOPPED, MachineState.DELETED, MachineState.UNKNOWN}),
    MachineState.STOPPED: frozenset({MachineState.RUNNING, MachineState.DELETED, MachineState.UNKNOWN}),
    MachineState.UNKNOWN: frozenset({MachineState.RUNNING, MachineState.STOPPED, MachineState.DELETED}),
    MachineState.DELETED: frozenset(),
}


def add_machine(
    *,
    name: str,
    backend: str,
    actor: Actor,
    ref: str = "",
    scope: str = "default",
    engine: str = "",
    host: str | None = None,
    track_commands: bool = True,
    labels: dict[str, str] | None = None,
) -> Machine:
    """Register a machine. One whose processes live on a host (local, tmux, docker on a unix socket) lives
    on ``host``, by default the one it is added on."""
    if not MACHINE_NAME.match(name or ""):
        raise UsageError(f"machine name {name!r} must be 1-100 letters, digits, '-' or '_'")
    if backend not in Backend.values:
        raise UsageError(f"backend must be one of {', '.join(Backend.values)}, not {backend!r}")
    check_identity(scope, "scope")
    machine = Machine(name=name, backend=backend, ref=ref, scope=scope, engine=engine, host=host or "")
    machine.track_commands = track_commands
    machine.labels = parse_labels([f"{key}={value}" for key, value in (labels or {}).items()])
    if host is None and machine.needs_host:
        machine.host = settings.TETHER_HOST
    if problems := machine.problems():
        field, problem = next(iter(problems.items()))
        raise UsageError(f"--{field}: {problem}")
    try:
        with transaction.atomic():
            machine.save(force_insert=True)
            MachineEvent.objects.create(
                machine=machine, from_state="", to_state=machine.state, actor=actor.label, user=actor.user
            )
    except IntegrityError:
        raise IdentityConflict(f"a machine named {name!r} already exists") from None
    return machine


def note_machine(machine: Machine, actor: Actor, reason: str, *, kind: str = "state", **detail) -> None:
    """A machine event that changes no state (what it stands for, where it lives; ``kind``: what was done to it,
    a file moved, with its ``detail``)."""
    MachineEvent.objects.create(
        machine=machine, from_state=machine.state, to_state=machine.state, actor=actor.label, user=actor.user,
        reason=reason, kind=kind, detail=detail,
    )  # fmt: skip


def record_placement(execution: Execution, *, instance: str, actor: Actor) -> Execution:
    """Write down which backend object ``execution`` is about to run in: the container's id, the tmux
    server (pid@start time) or the host's boot. When the machine's name now stands for another object than
    the one last seen there, the machine gets a new incarnation (with its event); resolution later compares
    what it ran in with what is there. ``instance`` "" (nothing there: the spawn will say why) changes nothing.
    """
    with transaction.atomic():
        machine = Machine.objects.select_for_update().get(pk=execution.machine_id)
        if instance and machine.instance != instance:
            replaced = bool(machine.instance)  # the first sighting replaces nothing
            Machine.objects.filter(pk=machine.pk).update(
                instance=instance, incarnation=F("incarnation") + int(replaced), updated_at=Now()
            )
            note_machine(
                machine,
                actor,
                f"{machine.backend} now {instance}"
                + (f", replacing {machine.instance}: a new incarnation" if replaced else " (first seen)"),
            )
            machine.refresh_from_db()
        if instance:
            Execution.objects.filter(pk=execution.pk).update(
                ran_on_instance=instance, ran_on_incarnation=machine.incarnation
            )
    execution.refresh_from_db()
    return execution


def set_machine_state(machine: Machine, to_state: str, *, actor: Actor, reason: str = "") -> Machine:
    """Stop, start, delete or mark a machine; stopping or deleting needs a free command slot."""
    from_state = machine.state
    if to_state not in MACHINE_TRANSITIONS.get(from_state, frozenset()):
        raise TransitionRefused(f"machine {machine.name}", from_state, to_state)
    rows = Machine.objects.filter(pk=machine.pk, state=from_state)
    if to_state in {MachineState.STOPPED, MachineState.DELETED}:
        rows = rows.filter(active_execution__isnull=True)
    with transaction.atomic():
        if rows.update(state=to_state, updated_at=Now()) != 1:
            current = Machine.objects.select_related("active_execution").filter(pk=machine.pk).first()
            if current is not None and current.state == from_state and current.active_execution is not None:
                raise_slot_refusal(machine.pk, f"move machine {machine.name} to {to_state}")
            raise TransitionRefused(
                f"machine {machine.name}", current.state if current else None, to_state, "it changed meanwhile"
            )
        MachineEvent.objects.create(
            machine=machine, from_state=from_state, to_state=to_state, actor=actor.label, user=actor.user, reason=reason
        )
    machine.refresh_from_db()
    return machine


def set_track_commands(machine: Machine, track: bool, *, actor: Actor) -> bool:
    """Turn the shell integration on or off for the machine's next shells (compare-and-set, with an event).
    False when it was so already."""
    with transaction.atomic():
        if not Machine.objects.filter(pk=machine.pk, track_commands=not track).update(
            track_commands=track, updated_at=Now()
        ):
            return False
        machine.track_commands = track
        said = "on" if track else "off"
        note_machine(machine, actor, f"command tracking turned {said} for its next shells")
    return True


def set_file_roots(machine: Machine, roots: list[str], *, actor: Actor) -> bool:
    """Let files be moved under exactly ``roots`` on the machine (absolute paths; "/" for all; none: no file
    transfers), compare-and-set on the roots it had, with an event naming both. False when it had them already."""
    clean = []
    for root in roots:
        if not root.startswith("/") or "\n" in root or "\x00" in root or len(root) > 4096:
            raise UsageError(f"file path {root!r} must be an absolute path (at most 4096 bytes, one line)")
        normal = normal_path(root)
        if normal not in clean:
            clean.append(normal)
    with transaction.atomic():
        if (before := _replace(machine, "file_roots", clean)) is _SAME:
            return False
        note_machine(machine, actor, f"file paths: {', '.join(clean) or 'none'} (were {', '.join(before) or 'none'})")
    return True


_SAME = object()


def _replace(machine: Machine, field: str, value):
    """Compare-and-set ``field`` to ``value`` (in the caller's transaction): what it was, or _SAME."""
    before = Machine.objects.select_for_update().values_list(field, flat=True).get(pk=machine.pk)
    if before == value:
        return _SAME
    Machine.objects.filter(pk=machine.pk).update(**{field: value}, updated_at=Now())
    setattr(machine, field, value)
    return before


def set_labels(machine: Machine, labels: dict[str, str], *, actor: Actor) -> bool:
    """Give the machine exactly ``labels`` (compare-and-set on the labels it had, with an event naming both);
    False when it had them already. Access granted through a label it loses ends with it."""
    labels = parse_labels([f"{key}={value}" for key, value in labels.items()])
    with transaction.atomic():
        if (before := _replace(machine, "labels", labels)) is _SAME:
            return False
        note_machine(machine, actor, f"labels: {said(labels)} (were {said(before)})")
        transaction.on_commit(lambda: machine_labels_changed.send_robust(Machine, machine=machine, before=before))
    return True

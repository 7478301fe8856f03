"""Durable execution records: machines, executions and their append-only audit trail.

Only ``executions.actions`` changes state fields. The constraints below restate
the invariants so that a bug elsewhere fails loudly in the database instead of
writing a record that lies.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from executions.engines import engine_problem
from executions.outcomes import wait_status_label


class Backend(models.TextChoices):
    LOCAL = "local", "Local PTY"
    TMUX = "tmux", "tmux"
    DOCKER = "docker", "Docker exec"


class MachineState(models.TextChoices):
    RUNNING = "running"
    STOPPED = "stopped"
    DELETED = "deleted"
    UNKNOWN = "unknown"


class State(models.TextChoices):
    PENDING = "pending"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"
    RESOLVED = "resolved"


class Evidence(models.TextChoices):
    """How we know the state an execution is in."""

    NONE = "", "—"
    SUBMITTED = "submitted"
    CLAIMED = "claimed"
    OBSERVED = "observed"
    EXITED = "exited"
    # A wait status its source cannot split: docker reports death by signal N as 128+N, the same number as
    # a program's own exit 128+N, so 137 is SIGKILL or exit 137.
    EXIT_STATUS = "exit_status"
    SIGNALED = "signaled"
    SPAWN_FAILED = "spawn_failed"
    # Its owner died before the program could start, and the backend proves it did not.
    NEVER_STARTED = "never_started"
    RESET = "reset"
    KILLED = "killed"
    IDLE_REAPED = "idle_reaped"
    DEADLINE = "deadline"
    OUTPUT_LIMIT = "output_limit"
    CANCELLED = "cancelled"
    CONTROLLER_LOST = "controller_lost"
    ADOPTED = "adopted"
    OPERATOR_RESOLVED = "operator_resolved"


class Kind(models.TextChoices):
    COMMAND = "command"
    TERMINAL = "terminal"


# States whose outcome is settled: the slot is free and the record is final.
FINAL_STATES = frozenset({State.COMPLETED, State.CANCELLED, State.RESOLVED})
# States in which observation has ended, so an end time must exist.
ENDED_STATES = FINAL_STATES | {State.UNKNOWN}
# States that hold the machine's command slot.
SLOT_STATES = frozenset({State.PENDING, State.DISPATCHED, State.RUNNING, State.UNKNOWN})


# How a completed execution that did not simply exit is described to people.
_ENDED_LABELS = {
    Evidence.SPAWN_FAILED: "Did not start",
    Evidence.NEVER_STARTED: "Never started: its worker stopped before starting it",
    Evidence.RESET: "Ended by reset",
    Evidence.KILLED: "Killed",
    Evidence.IDLE_REAPED: "Closed: idle",
    Evidence.DEADLINE: "Closed: session deadline reached",
    Evidence.OUTPUT_LIMIT: "Closed: output limit reached",
}


# Evidence that carries an exit code (a program's own exit, or a wait status that may be one).
CODED_EVIDENCE = (Evidence.EXITED, Evidence.EXIT_STATUS)


class Machine(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    backend = models.CharField(max_length=16, choices=Backend.choices)
    ref = models.CharField(
        "backend reference",
        max_length=255,
        blank=True,
        help_text="Container id or name (docker), socket name (tmux); empty for local.",
    )
    engine = models.CharField(
        max_length=255, blank=True, help_text="Docker engine URL (DOCKER_HOST style); empty means the local socket."
    )
    scope = models.CharField("owner scope", max_length=200, default="default")
    host = models.CharField(
        max_length=255,
        blank=True,
        help_text="Where its processes live (local, tmux, docker on this host's engine socket): only a worker "
        "on this host runs, adopts or inspects them. Empty for docker on a network engine: any worker serves it.",
    )
    state = models.CharField(max_length=16, choices=MachineState.choices, default=MachineState.RUNNING)
    labels = models.JSONField(
        default=dict,
        blank=True,
        help_text='What it is for, as key=value pairs ({"team": "payments"}): access granted to a label reaches '
        "every machine that carries it.",
    )
    file_roots = models.JSONField(
        "file paths",
        default=list,
        blank=True,
        help_text="Absolute paths under which files may be listed, downloaded and uploaded through the API, e.g. "
        '["/workspace", "/tmp"] ("/" for all); empty: no file transfers. Checked again on the machine with links '
        "followed; the machine's own user permissions apply as in its shells.",
    )
    track_commands = models.BooleanField(
        default=True,
        help_text="Start its shells with Tether's shell integration, so each typed command is kept on the record "
        "(docs/commands.md). Off: shells start exactly as configured.",
    )
    # The backend object behind the name as last seen at a dispatch: the container's id, the tmux server
    # (pid@start time) or the host's boot id. When another one is seen the incarnation is bumped, so
    # resolution can tell "the same container" from "a new container with the same name".
    instance = models.CharField(max_length=255, blank=True)
    incarnation = models.PositiveIntegerField(default=1)
    active_execution = models.OneToOneField(
        "Execution",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="held_slot",
        help_text="The command slot: the one execution that currently owns this machine.",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(backend__in=Backend.values), name="machine_backend_valid"),
            models.CheckConstraint(condition=Q(state__in=MachineState.values), name="machine_state_valid"),
            models.CheckConstraint(
                condition=~Q(state=MachineState.DELETED) | Q(active_execution__isnull=True),
                name="machine_deleted_has_free_slot",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def needs_host(self) -> bool:
        """Whether its processes live on one host: a local PTY, a tmux server, or docker reached through a
        unix socket (the default engine is each host's own)."""
        if self.backend != Backend.DOCKER:
            return True
        return not self.engine or urlsplit(self.engine).scheme == "unix"

    def problems(self) -> dict[str, str]:
        """What keeps this machine from being usable, by field: add_machine refuses it, the admin's add
        form shows it beside the field."""
        found = {}
        if self.backend == Backend.DOCKER and not self.ref:
            found["ref"] = "a docker machine needs the container id or name"
        if self.host and not self.needs_host:
            found["host"] = "a docker machine on a network engine has no host: any worker that reaches it serves it"
        if self.engine and self.backend != Backend.DOCKER:
            found["engine"] = f"an engine URL is only for docker machines, not {self.backend}"
        elif engine := engine_problem(self.engine):
            found["engine"] = engine
        return found

    def clean(self) -> None:
        if self.needs_host and not self.host:
            self.host = settings.TETHER_HOST  # where it is added, as add_machine does
        if problems := self.problems():
            raise ValidationError(problems)


class Execution(models.Model):
    # scope, execution_id, kind, machine, spec and spec_digest are fixed once inserted: on PostgreSQL
    # a trigger (migration 0006) refuses an UPDATE that changes them.
    # Whose (scope, id) it is: "user:PK" for what a user submitted through the API (two people may use the same
    # scope and id without meeting), "" for the command line's and for shells (whose ids are their own).
    namespace = models.CharField(max_length=64, blank=True, default="")
    scope = models.CharField(max_length=200)
    execution_id = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.COMMAND)
    spec = models.JSONField()
    spec_digest = models.CharField(max_length=64)
    machine = models.ForeignKey(Machine, on_delete=models.PROTECT, related_name="executions")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    evidence = models.CharField(max_length=32, choices=Evidence.choices, default=Evidence.SUBMITTED)
    exit_code = models.IntegerField(null=True, blank=True)
    exit_signal = models.IntegerField(null=True, blank=True)
    # Why its process was closed (exited, killed, idle, ...), in the words of the app that ran it; written
    # when the outcome is settled, so a command, which has no terminal session, keeps it too.
    close_reason = models.CharField(max_length=64, blank=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    resolution_note = models.TextField(blank=True)
    # Where it was dispatched: resolution checks the machine is still that one (same reference and incarnation).
    ran_on_ref = models.CharField(max_length=255, blank=True)
    ran_on_incarnation = models.PositiveIntegerField(null=True, blank=True)
    ran_on_instance = models.CharField(max_length=255, blank=True)
    # Bounded capture of a command's output (the tail is kept when it overflows).
    output = models.BinaryField(default=b"", blank=True)
    output_truncated = models.BigIntegerField(default=0, help_text="Bytes dropped from the head of the output.")
    # Saved while it runs (terminals.owner.host), so a worker lost mid-run leaves what it saw. Complete only when
    # an owner saw the stream to its end: after a crash, what was printed while no worker saw it is not here,
    # and nobody can say how much (an API reader is told: ``complete`` false).
    output_complete = models.BooleanField(
        default=False, help_text="The output was seen to its end (false: a worker was lost while it ran)."
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["namespace", "scope", "execution_id"], name="execution_identity_unique"),
            models.CheckConstraint(condition=Q(state__in=State.values), name="execution_state_valid"),
            models.CheckConstraint(condition=Q(evidence__in=Evidence.values), name="execution_evidence_valid"),
            models.CheckConstraint(
                condition=~Q(state__in=sorted(ENDED_STATES)) | Q(ended_at__isnull=False),
                name="execution_ended_has_end_time",
            ),
            models.CheckConstraint(
                condition=~Q(state=State.COMPLETED) | ~Q(evidence=""),
                name="execution_completed_has_evidence",
            ),
            models.CheckConstraint(
                condition=Q(exit_code__isnull=True) | Q(evidence__in=CODED_EVIDENCE),
                name="execution_exit_code_only_when_exited",
            ),
            models.CheckConstraint(
                condition=~Q(evidence__in=CODED_EVIDENCE) | Q(exit_code__isnull=False),
                name="execution_exited_has_exit_code",
            ),
            models.CheckConstraint(
                condition=~Q(state=State.RESOLVED) | (Q(resolved_at__isnull=False) & ~Q(resolution_note="")),
                name="execution_resolved_has_note",
            ),
            # One live execution per machine: those in a slot state are exactly the machine's
            # active_execution (submit takes the slot in the insert's transaction; only a final state frees it).
            models.UniqueConstraint(
                fields=["machine"],
                condition=Q(state__in=sorted(SLOT_STATES)),
                name="execution_one_live_per_machine",
            ),
        ]
        permissions = [("resolve_execution", "Can resolve an unknown execution (after Tether's checks)")]
        indexes = [
            models.Index(fields=["state", "created_at"], name="execution_pending_idx", condition=Q(state="pending")),
            models.Index(fields=["machine", "-created_at"], name="execution_machine_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.scope}/{self.execution_id}"

    @property
    def outcome_label(self) -> str:
        """The honest one-line outcome shown to people."""
        if self.state == State.COMPLETED:
            if self.evidence == Evidence.EXITED:
                return f"Exited with code {self.exit_code}"
            if self.evidence == Evidence.EXIT_STATUS:
                return wait_status_label(self.exit_code)
            if self.evidence == Evidence.SIGNALED and self.exit_signal is not None:
                return f"Ended by signal {self.exit_signal}"
            return _ENDED_LABELS.get(self.evidence, f"Ended ({self.evidence})")
        if self.state == State.UNKNOWN:
            return "Connection lost; outcome unknown"
        if self.state == State.RESOLVED:
            return "Resolved: outcome unknown"
        if self.state == State.CANCELLED:
            return "Cancelled before it ran"
        return self.get_state_display()


class ExecutionAlias(models.Model):
    """Another producer's id for the same logical execution, so it is listed once. It lives in the namespace of
    whoever gave it (as an execution's own id does), where it names one execution, as an own id would."""

    namespace = models.CharField(max_length=64, blank=True, default="")
    scope = models.CharField(max_length=200)
    alias_id = models.CharField(max_length=200)
    execution = models.ForeignKey(Execution, on_delete=models.CASCADE, related_name="aliases")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "scope", "alias_id"], name="execution_alias_identity_unique")
        ]

    def __str__(self) -> str:
        return f"{self.scope}/{self.alias_id} → {self.execution_id}"


class AppendOnlyError(Exception):
    pass


class AppendOnly(models.Model):
    """An audit row: written once, never updated or deleted (a trigger enforces it on PostgreSQL too)."""

    actor = models.CharField(max_length=200, help_text="user:NAME, worker:ID or command:NAME")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    reason = models.TextField(blank=True)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise AppendOnlyError(f"{type(self).__name__} rows are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnlyError(f"{type(self).__name__} rows are append-only")


# The evidence of an event that records a fact about an execution, not how its state is known.
ALIASED = "aliased"  # another id of its producer's now names it


class ExecutionEvent(AppendOnly):
    execution = models.ForeignKey(Execution, on_delete=models.PROTECT, related_name="events")
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    evidence = models.CharField(max_length=32, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.from_state or '∅'} → {self.to_state} ({self.evidence})"


class MachineEvent(AppendOnly):
    """A machine's history: its state changes, and what was done to it that is not one (``kind``: a file
    uploaded or downloaded, with ``detail``)."""

    machine = models.ForeignKey(Machine, on_delete=models.PROTECT, related_name="events")
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    kind = models.CharField(max_length=32, default="state", help_text="state, file.uploaded or file.downloaded")
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.from_state or '∅'} → {self.to_state}"

"""Owner workers, their process leases and the terminal sessions viewers attach to.

The lease row is authoritative for cleanup: it says which worker owns which
live process, with a fencing token that grows on every claim. Every write a
worker makes about a process is conditional on (worker, token); zero rows
changed means the lease was lost and the worker lets go at once.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from executions.models import AppendOnly, Execution, Machine
from terminals.protocol import Reason


class WorkerState(models.TextChoices):
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


class Worker(models.Model):
    """A ``terminal_worker`` process: who it is, where, and whether it still beats."""

    worker_id = models.CharField(max_length=64, unique=True)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    process_started_at = models.BigIntegerField(help_text="Start time in clock ticks since boot (/proc/PID/stat).")
    boot_id = models.CharField(max_length=64)
    channel_name = models.CharField(max_length=255, blank=True, help_text="Where consumers send session messages.")
    state = models.CharField(max_length=16, choices=WorkerState.choices, default=WorkerState.RUNNING)
    started_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField()

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(state__in=WorkerState.values), name="worker_state_valid")]

    def __str__(self) -> str:
        return f"{self.worker_id} ({self.host} pid {self.pid})"


class WorkerEvent(AppendOnly):
    """Append-only audit of a worker's life: drain requested, drained, stopped, found dead."""

    worker = models.ForeignKey(Worker, on_delete=models.PROTECT, related_name="events")
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.from_state or '∅'} → {self.to_state}"


def ends_with_worker(handle: dict) -> str:
    """See ``ProcessLease.ends_with_worker``."""
    if not handle or handle.get("launch") or "holder" in handle or handle.get("backend") not in ("local", "docker"):
        return ""
    return handle.get("unheld") or "no session holder runs on its host (TETHER_HOLDER is off, or it is not built)"


class ProcessLease(models.Model):
    """Ownership of one execution's live process. One row per execution; ``token`` grows on every claim."""

    execution = models.OneToOneField(Execution, on_delete=models.PROTECT, related_name="lease")
    worker = models.ForeignKey(Worker, null=True, blank=True, on_delete=models.PROTECT, related_name="leases")
    token = models.PositiveBigIntegerField(default=1)
    handle = models.JSONField(default=dict, blank=True, help_text="Backend handle to find the process again.")
    heartbeat_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)
    # An operator's or a command's request for the owner to act on the process (cancel, kill, fail,
    # complete, reset). The owner picks it up on its next heartbeat: the row is the message.
    requested_action = models.CharField(max_length=16, blank=True)
    requested_by = models.CharField(max_length=200, blank=True)
    requested_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["expires_at"], name="lease_live_expiry_idx", condition=Q(released_at__isnull=True)),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(released_at__isnull=False) | Q(worker__isnull=False), name="lease_live_has_owner"
            ),
        ]

    def __str__(self) -> str:
        return f"lease {self.execution_id} token {self.token}"

    @property
    def ends_with_worker(self) -> str:
        """Why this process ends when its worker stops, "" when something else keeps it (a session holder,
        a tmux server) or it is not started yet. The handle's secret is never shown."""
        return ends_with_worker(self.handle or {})

    @property
    def is_live(self) -> bool:
        return self.released_at is None


class ProcessState(models.TextChoices):
    LIVE = "live"
    CLOSING = "closing"
    CLOSED = "closed"


class SnapshotKind(models.TextChoices):
    LIVE = "live"
    ARCHIVED = "archived"


# Why a session's process closed: the protocol's stored reasons (terminals.protocol.Reason, which says what
# each means for the viewer), as the database's choices.
CloseReason = models.TextChoices(
    "CloseReason", [("NONE", ("", "—")), *((reason.name, reason.value) for reason in Reason if reason.stored)]
)


class TerminalSession(models.Model):
    """The persistent terminal of one machine that viewers attach to.

    Its identity survives resets: each reset or auto-reset starts a new
    execution (``generation`` + 1) under the same session id, so a browser
    keeps one URL.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    machine = models.ForeignKey(Machine, on_delete=models.PROTECT, related_name="terminal_sessions")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="terminal_sessions")
    execution = models.OneToOneField(Execution, on_delete=models.PROTECT, related_name="terminal_session")
    generation = models.PositiveIntegerField(default=1)
    process_state = models.CharField(max_length=16, choices=ProcessState.choices, default=ProcessState.LIVE)
    snapshot_kind = models.CharField(max_length=16, choices=SnapshotKind.choices, default=SnapshotKind.LIVE)
    snapshot_hidden = models.BooleanField(default=False, help_text="Dismissed: hides the snapshot only.")
    close_reason = models.CharField(max_length=32, choices=CloseReason.choices, blank=True)
    snapshot = models.BinaryField(default=b"", blank=True, help_text="The latest screen or output tail.")
    output_offset = models.PositiveBigIntegerField(default=0, help_text="Absolute offset of the end of output.")
    last_viewer_at = models.DateTimeField(null=True, blank=True)
    # Shell integration (terminals.marks) of the current generation's shell: its nonce (a secret: never
    # shown), or why it has none; and the last generation whose shell was seen marking its commands.
    marks_nonce = models.CharField(max_length=64, blank=True, editable=False)
    marks_note = models.CharField(max_length=200, blank=True, help_text="Why its commands are not tracked.")
    marks_generation = models.PositiveIntegerField(default=0)
    viewer_id = models.CharField(
        max_length=64, blank=True, help_text="The window that owns the session now; any other is superseded."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(
        null=True, blank=True, help_text="When retention cleanup removed the final screen (identity and exit stay)."
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["machine"],
                condition=Q(process_state__in=["live", "closing"]),
                name="one_open_terminal_per_machine",
            ),
            models.CheckConstraint(condition=Q(process_state__in=ProcessState.values), name="session_state_valid"),
            models.CheckConstraint(
                condition=~Q(process_state="closed") | (Q(closed_at__isnull=False) & Q(snapshot_kind="archived")),
                name="session_closed_is_archived",
            ),
        ]
        permissions = [
            ("dismiss_terminalsession", "Can dismiss a terminal snapshot"),
            ("complete_terminalsession", "Can ask a terminal session to complete"),
            ("fail_terminalsession", "Can fail a terminal session"),
            ("kill_terminalsession", "Can kill a terminal session"),
            ("reset_terminalsession", "Can reset a terminal session"),
            ("takeover_terminalsession", "Can write into another user's shell (the user is told)"),
        ]

    def __str__(self) -> str:
        return f"terminal {self.id} on {self.machine.name}"


class SessionEvent(AppendOnly):
    """Append-only audit of session-level happenings: attach, supersede, reset, close, operator actions."""

    session = models.ForeignKey(TerminalSession, on_delete=models.PROTECT, related_name="events")
    kind = models.CharField(max_length=32)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} by {self.actor}"


FONT_SIZES = range(8, 33)


class ViewerPreference(models.Model):
    """How a person likes their terminal page, kept on the server so it follows them to any browser."""

    FONT_SIZES = FONT_SIZES

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="terminal_preference")
    font_size = models.PositiveSmallIntegerField(default=14)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(font_size__gte=FONT_SIZES.start) & Q(font_size__lt=FONT_SIZES.stop),
                name="preference_font_size_range",
            )
        ]

    def __str__(self) -> str:
        return f"terminal preferences of {self.user_id}"


class CommandState(models.TextChoices):
    RUNNING = "running"
    EXITED = "exited"
    UNKNOWN = "unknown"


class CommandSource(models.TextChoices):
    """Where the command line came from."""

    HISTORY = "history", "the shell's history"
    SCREEN = "screen", "the screen, as typed at the prompt"
    HIDDEN = "hidden", "kept out of the shell's history"
    EXPIRED = "expired", "removed by retention cleanup"


class CommandRecord(models.Model):
    """One command typed into a terminal session, as the shell's own marks told it (terminals.marks).

    ``running`` from the shell's command mark; ``exited`` only from its end mark with the shell's status;
    ``unknown`` when its end was never seen (the shell or its worker died first, the session was reset or
    reaped). Offsets are the session's stream: ``stream`` is 0 for a holder's stream (the same for every
    owner) and otherwise the lease token of the owner that numbered it.
    """

    session = models.ForeignKey(TerminalSession, on_delete=models.PROTECT, related_name="commands")
    execution = models.ForeignKey(Execution, on_delete=models.PROTECT, related_name="commands")
    generation = models.PositiveIntegerField()
    stream = models.PositiveBigIntegerField()
    command = models.TextField(blank=True, help_text="The command line as typed.")
    source = models.CharField(max_length=16, choices=CommandSource.choices, default=CommandSource.HISTORY)
    state = models.CharField(max_length=16, choices=CommandState.choices, default=CommandState.RUNNING)
    exit_status = models.IntegerField(null=True, blank=True, help_text="The shell's $? for it.")
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    output_start = models.PositiveBigIntegerField(help_text="Stream offset where its output begins.")
    output_end = models.PositiveBigIntegerField(null=True, blank=True, help_text="Where it ended, if seen.")
    prompt = models.PositiveIntegerField(null=True, blank=True, help_text="The prompt it was typed at (bash, zsh).")
    evidence = models.TextField(blank=True, help_text="How its start and its end are known.")
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["started_at", "id"]
        indexes = [models.Index(fields=["session", "-id"], name="command_session_latest_idx")]
        constraints = [
            models.UniqueConstraint(fields=["execution", "stream", "output_start"], name="one_record_per_mark"),
            models.CheckConstraint(condition=Q(state__in=CommandState.values), name="command_state_valid"),
            models.CheckConstraint(
                condition=~Q(state="exited") | (Q(exit_status__isnull=False) & Q(ended_at__isnull=False)),
                name="command_exited_has_status",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.command or '(command)'} [{self.state}]"

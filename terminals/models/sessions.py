"""The terminal sessions viewers attach to, their audit events and their viewers' preferences."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from executions.models import AppendOnly, Execution, Machine
from terminals.protocol import Reason


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
    # A closed shell's last screen as the rows its page showed (rendered by the page's emulator, every backend),
    # and whether every byte it was drawn from was there; kept, hidden and removed with the snapshot.
    last_screen = models.TextField(blank=True, default="", help_text="The closed shell's last screen, as text.")
    last_screen_exact = models.BooleanField(default=False, help_text="Drawn from every byte of its screen.")
    last_viewer_at = models.DateTimeField(null=True, blank=True)
    # Shell integration (terminals.marks) of the current generation's shell: its nonce (a secret: never
    # shown), or why it has none; and the last generation whose shell was seen marking its commands.
    marks_nonce = models.CharField(max_length=64, blank=True, editable=False)
    marks_note = models.CharField(max_length=200, blank=True, help_text="Why its commands are not tracked.")
    marks_generation = models.PositiveIntegerField(default=0)
    # A POSIX shell's history as its last end mark said it ({"generation", "number", "line", "end"}): a new
    # owner goes on from it, so a line pasted before a worker's death is recorded at its end (the history
    # before it is long gone from what the holder kept).
    marks_history = models.JSONField(default=dict, blank=True, editable=False)
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
            ("observe_terminalsession", "Can watch another user's shell and play its recordings"),
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

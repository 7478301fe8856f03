"""The commands typed into terminal sessions, as their shells' marks told them (terminals.marks)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from executions.models import Execution
from terminals.models.sessions import TerminalSession


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

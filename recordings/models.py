"""Recordings of terminal sessions (asciicast v3) and the links that share a live session or a recording.

A recording is one generation's shell (one execution) from its start to its end. While the shell runs, its
owner worker writes the events in chunks to the database, fenced by its lease, so a worker that dies loses
at most the last moments and the next owner carries on in the same recording. When the shell has ended the
chunks become one compressed ``.cast`` file in the recordings storage (``recordings.store``), and
the chunks go.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from executions.models import Execution
from terminals.models.sessions import TerminalSession


class RecordingState(models.TextChoices):
    RECORDING = "recording"  # the shell runs: events are in chunks
    SAVED = "saved"  # the shell ended: the events are one file in the recordings storage
    EXPIRED = "expired"  # past retention: the file was removed (the row, its times and markers stay)


class Recording(models.Model):
    session = models.ForeignKey(TerminalSession, on_delete=models.PROTECT, related_name="recordings")
    execution = models.OneToOneField(Execution, on_delete=models.PROTECT, related_name="recording")
    generation = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=RecordingState.choices, default=RecordingState.RECORDING)
    started_at = models.DateTimeField(help_text="When the recording's first event could happen (the shell's start).")
    started_epoch = models.FloatField(help_text="The same moment in Unix seconds: event times count from here.")
    cols = models.PositiveSmallIntegerField(help_text="The grid the recording starts with.")
    rows = models.PositiveSmallIntegerField()
    # The grid as last recorded: a later owner of the shell (an adoption) starts from it, not from the spec's.
    grid_cols = models.PositiveSmallIntegerField(default=80)
    grid_rows = models.PositiveSmallIntegerField(default=24)
    input_recorded = models.BooleanField(default=False, help_text="Keys typed are in the recording too.")
    # Where the recorded output stands in the shell's stream: ``stream`` as for command records (0 for a
    # session holder's offsets, the same under every owner; else the lease token of the owner numbering them).
    stream = models.PositiveBigIntegerField(default=0)
    output_end = models.PositiveBigIntegerField(default=0, help_text="Stream offset recorded up to.")
    output_bytes = models.PositiveBigIntegerField(default=0, help_text="Output bytes in the recording.")
    size = models.PositiveBigIntegerField(default=0, help_text="Bytes of events so far (the size bound's measure).")
    chunks = models.PositiveIntegerField(default=0, help_text="Chunks written so far (the next one's number).")
    truncated_at = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Output offset where the size bound cut the recording."
    )
    markers = models.JSONField(default=list, blank=True, help_text="[seconds, label] of each marker.")
    duration = models.FloatField(default=0.0)
    file = models.CharField(max_length=255, blank=True, help_text="The .cast.gz in the recordings storage.")
    file_bytes = models.PositiveBigIntegerField(default=0, help_text="Compressed size of the file.")
    finished_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "terminals_recording"  # made when recordings were part of the terminals app
        ordering = ["-started_at", "-id"]
        indexes = [
            models.Index(fields=["finished_at"], name="recording_saved_idx", condition=Q(state="saved")),
            models.Index(fields=["started_at"], name="recording_open_idx", condition=Q(state="recording")),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=RecordingState.values), name="recording_state_valid"),
            models.CheckConstraint(
                condition=~Q(state="saved") | (Q(finished_at__isnull=False) & ~Q(file="")),
                name="recording_saved_has_file",
            ),
        ]

    def __str__(self) -> str:
        return f"recording of {self.session_id} generation {self.generation}"

    @property
    def playable(self) -> bool:
        return self.state != RecordingState.EXPIRED


class RecordingChunk(models.Model):
    """Events of a recording not yet in its file: its output as read, and its other events as lines of
    ``[unix_seconds, code, data]`` (the records are in recordings/asciicast.py). The events are a file in the
    recordings storage (``file``, recordings/store.py); chunks written before that were kept in
    ``data``, and still make their recording's file. A file's row has no ``data`` (NULL, not empty): a release
    that knows only ``data`` fails on it rather than make a recording without it."""

    recording = models.ForeignKey(Recording, on_delete=models.CASCADE, related_name="chunk_rows")
    number = models.PositiveIntegerField()
    file = models.CharField(max_length=255, blank=True, default="", db_default="")  # an older release omits it
    data = models.BinaryField(null=True, blank=True)
    written_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "terminals_recordingchunk"
        ordering = ["number"]
        constraints = [models.UniqueConstraint(fields=["recording", "number"], name="one_chunk_per_number")]

    def __str__(self) -> str:
        return f"chunk {self.number} of recording {self.recording_id}"


class ShareLink(models.Model):
    """A read-only, expiring, revocable link to a live session (watched as an observer) or a recording, for
    logged-in users. Only the token's SHA-256 is kept: the link is shown once, when it is made."""

    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    session = models.ForeignKey(TerminalSession, on_delete=models.PROTECT, related_name="share_links")
    recording = models.ForeignKey(
        Recording, null=True, blank=True, on_delete=models.PROTECT, related_name="share_links"
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    opened = models.PositiveIntegerField(default=0, help_text="Times it was opened.")

    class Meta:
        db_table = "terminals_sharelink"
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(revoked_at__isnull=True) | Q(revoked_by__isnull=False), name="share_revoked_by_someone"
            ),
        ]
        permissions = [("revoke_sharelink", "Can revoke another user's share link")]

    def __str__(self) -> str:
        what = f"recording {self.recording_id}" if self.recording_id else f"live session {self.session_id}"
        return f"share link {self.pk} to {what}"

    @property
    def kind(self) -> str:
        return "recording" if self.recording_id else "live"

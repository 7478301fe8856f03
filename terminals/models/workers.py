"""Owner workers and their process leases.

The lease row is authoritative for cleanup: it says which worker owns which
live process, with a fencing token that grows on every claim. Every write a
worker makes about a process is conditional on (worker, token); zero rows
changed means the lease was lost and the worker lets go at once.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Case, F, Q, When
from django.db.models.functions import Greatest, Now
from django.db.models.query_utils import DeferredAttribute
from django.utils import timezone

from executions.models import AppendOnly, Execution
from terminals.backends import handles
from terminals.backends.handles import Handle


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
    link = models.CharField(
        max_length=255,
        blank=True,
        default="",
        db_default="",  # a worker of the previous release registers without naming it (rolling upgrade)
        help_text="Where a web process dials this worker's direct link for its sessions' streams (none: Redis).",
    )
    backends = models.JSONField(default=list, blank=True, help_text="The backends it serves (local, tmux, docker).")
    state = models.CharField(max_length=16, choices=WorkerState.choices, default=WorkerState.RUNNING)
    started_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField()
    # Until when (database clock) this worker's last heartbeat keeps the leases it covers: one row written
    # per heartbeat, however many sessions the worker holds.
    # A database default too: a worker of the previous release registers without naming it (rolling upgrade).
    lease_until = models.DateTimeField(default=timezone.now, db_default=Now())

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(state__in=WorkerState.values), name="worker_state_valid")]
        permissions = [
            ("drain_worker", "Can drain an owner worker (it stops; its sessions are left for adoption or ended)"),
            ("run_recovery", "Can run the recovery pass over dead workers' sessions"),
        ]

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


class HandleAttribute(DeferredAttribute):
    """A lease's handle is typed wherever it is read: whatever is assigned (the JSON read from the database, a
    dict, a handle) becomes a ``Handle``, or None for none."""

    def __set__(self, instance, value) -> None:
        instance.__dict__[self.field.attname] = handles.load(value)


class HandleField(models.JSONField):
    """The handle as JSON in the database, written by ``terminals.backends.handles`` and read by it (the same
    JSON every release wrote, so that releases read each other's leases)."""

    descriptor_class = HandleAttribute

    @staticmethod
    def _json(value):
        return handles.dump(value) if value is None or isinstance(value, Handle) else value

    def get_prep_value(self, value):
        return super().get_prep_value(self._json(value))

    def get_db_prep_save(self, value, connection):
        # JSONField saves None as SQL NULL without asking get_prep_value: no handle is ``{}`` (NOT NULL).
        return super().get_db_prep_save(self._json(value), connection)

    def validate(self, value, model_instance) -> None:
        super().validate(self._json(value), model_instance)

    def value_to_string(self, obj):
        return self._json(self.value_from_object(obj))


def lease_expired() -> Q:
    """An unreleased lease has expired when neither its own expiry nor, while it is covered, its worker's
    heartbeat keeps it. Both are on the database clock; takeover waits for both."""
    return Q(expires_at__lt=Now()) & (Q(covered=False) | Q(worker__lease_until__lt=Now()))


def lease_expiry_expression():
    """When a lease expires as things stand: the later of its own expiry and, while covered, its worker's."""
    return Greatest(F("expires_at"), Case(When(covered=True, then=F("worker__lease_until")), default=F("expires_at")))


class ProcessLease(models.Model):
    """Ownership of one execution's live process. One row per execution; ``token`` grows on every claim.

    A lease is kept alive by its worker's heartbeat (``Worker.lease_until``) while ``covered``: a heartbeat
    writes the worker's row, not one row per session. A lease its worker no longer knows under its token
    is uncovered by the next heartbeat and then lasts only until its own ``expires_at``: it can be taken
    over alone while the worker goes on.
    """

    execution = models.OneToOneField(Execution, on_delete=models.PROTECT, related_name="lease")
    worker = models.ForeignKey(Worker, null=True, blank=True, on_delete=models.PROTECT, related_name="leases")
    token = models.PositiveBigIntegerField(default=1)
    handle = HandleField(default=dict, blank=True, help_text="Backend handle to find the process again.")
    # Written by workers of releases before 0013 only (they extended each lease at every beat): kept, unused,
    # so such workers go on working during a rolling upgrade. Dropped in a later release.
    heartbeat_at = models.DateTimeField(null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(help_text="Its own expiry: set when claimed or taken over.")
    covered = models.BooleanField(
        default=True, db_default=True, help_text="Whether its worker's heartbeat keeps it alive."
    )
    released_at = models.DateTimeField(null=True, blank=True)
    # When the session holder that held the process is known to be gone (its owner let it go after recording
    # the exit, or recovery ended it: a holder outliving its settled execution is swept, terminals.recovery).
    holder_ended_at = models.DateTimeField(null=True, blank=True)
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
        return self.handle.ends_with_worker() if self.handle is not None else ""

    @property
    def is_live(self) -> bool:
        return self.released_at is None

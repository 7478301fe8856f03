"""API tokens, what each call did with one, and the numbered input an API client has sent.

A token is shown once, when it is made; only its SHA-256 is kept (tokens are 256 random bits, so a fast
hash is enough), and it is found by its prefix. Tokens are never deleted: revoked, they keep their audit.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from executions.models import AppendOnly


class Scope(models.TextChoices):
    READ = "read", "Read: machines, executions and their output"
    RUN = "run", "Run: submit, cancel and resolve commands"
    TERMINALS = "terminals", "Terminals: open shells, read them, type into them"


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="What it is for: shown in every audit line of its calls.")
    prefix = models.CharField(max_length=16, unique=True, editable=False, help_text="How the token is found.")
    digest = models.CharField(max_length=64, editable=False)
    scopes = models.JSONField(default=list)
    # Narrower, never wider: when either is set the token reaches only these machines (by name) and the machines
    # carrying one of these labels ("key=value"), and only as far as its user's grants reach them at each call.
    machines = models.JSONField(default=list, blank=True)
    labels = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    revoke_reason = models.CharField(max_length=500, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "name"], condition=Q(revoked_at__isnull=True), name="api_token_name_unique"
            ),
        ]
        permissions = [("revoke_apitoken", "Can revoke another user's API token")]

    def __str__(self) -> str:
        return f"{self.name} ({self.user.get_username()}, tether_{self.prefix}_…)"

    @property
    def ended(self) -> str:
        """ "" while it can be used; else "revoked" or "expired"."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at <= timezone.now():
            return "expired"
        return ""

    @property
    def label(self) -> str:
        """How the audit names who acted through it."""
        return f"user:{self.user.get_username()} token:{self.name}"


class ApiTokenEvent(AppendOnly):
    """Made or revoked: by whom, when, why."""

    token = models.ForeignKey(ApiToken, on_delete=models.PROTECT, related_name="events")
    kind = models.CharField(max_length=16)

    class Meta:
        ordering = ["at", "id"]


class ApiCall(models.Model):
    """One call made with a token (refused ones too, once the token is known): the audit trail of the API."""

    token = models.ForeignKey(ApiToken, on_delete=models.PROTECT, related_name="calls")
    at = models.DateTimeField(auto_now_add=True)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=300)
    status = models.PositiveSmallIntegerField()
    problem = models.CharField(max_length=40, blank=True, help_text="The problem code of a refused call.")
    milliseconds = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["token", "-at"], name="api_call_token_idx")]

    def __str__(self) -> str:
        return f"{self.method} {self.path} → {self.status}"


class InputState(models.TextChoices):
    SENDING = "sending"  # given to the owner; not taken by it yet (until then, it can be given up)
    TAKEN = "taken"  # the owner took it to write it: from here on it may have been written
    WRITTEN = "written"


class ApiInput(models.Model):
    """One numbered piece of an API client's input to a session: claimed before it is sent, so a retry of
    the same number is never written twice, and confirmed once the owner wrote it."""

    token = models.ForeignKey(ApiToken, on_delete=models.PROTECT, related_name="+")
    # Either a terminal session's shell, or a command on pipes (its stdin).
    session = models.ForeignKey("terminals.TerminalSession", on_delete=models.CASCADE, related_name="+", null=True)
    execution = models.ForeignKey("executions.Execution", on_delete=models.CASCADE, related_name="+", null=True)
    client = models.CharField(max_length=100, blank=True)
    seq = models.BigIntegerField()
    size = models.PositiveIntegerField()
    # SHA-256 of the keys: a number sent again with other keys is refused (input_conflict), never dropped.
    digest = models.CharField(max_length=64, blank=True)
    closes = models.BooleanField(default=False, help_text="It closes a command's stdin: nothing is written after it")
    state = models.CharField(max_length=16, choices=InputState.choices, default=InputState.SENDING)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["token", "session", "client", "seq"], name="api_input_once"),
            models.UniqueConstraint(fields=["token", "execution", "client", "seq"], name="api_command_input_once"),
            models.CheckConstraint(
                condition=Q(session__isnull=True, execution__isnull=False)
                | Q(session__isnull=False, execution__isnull=True),
                name="api_input_one_target",
            ),
        ]

    def __str__(self) -> str:
        return f"input {self.seq} ({self.state})"

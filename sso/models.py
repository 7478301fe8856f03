"""Who a person is at the company's identity provider: its issuer and subject, never an email or a name (those
change, and one could be chosen to match someone else's)."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Identity(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity")
    issuer = models.CharField(max_length=500)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_once")]
        verbose_name_plural = "identities"

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"

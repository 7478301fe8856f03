"""Shared plumbing for the staff commands: domain errors become one stderr line and an exit status."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError
from django.db import models

from executions.errors import ExecutionError, UsageError
from executions.presenters import execution_json, execution_text


def require_fits(model: type[models.Model], field: str, value: str, option: str) -> None:
    """Refuse a value longer than its column as a usage error, before the database refuses it mid-write."""
    limit = model._meta.get_field(field).max_length
    if limit is not None and len(value) > limit:
        raise UsageError(f"{option} is {len(value)} characters long; at most {limit} fit")


class ExecutionCommand(BaseCommand):
    """A command whose ``run`` may raise domain errors; they map to documented exit statuses.

    0 done, 2 usage, 3 identity conflict, 4 refused by a guard, 5 not found.
    """

    def handle(self, *args, **options):
        try:
            return self.run(*args, **options)
        except ExecutionError as error:
            raise CommandError(str(error), returncode=error.exit_status) from None

    def run(self, *args, **options):  # pragma: no cover - abstract
        raise NotImplementedError

    def print_execution(self, execution, as_json: bool, **extra) -> None:
        """The record as text or one JSON object; ``extra`` (e.g. ``created``) is added to the JSON."""
        if as_json:
            self.stdout.write(json.dumps({**execution_json(execution), **extra}))
        else:
            self.stdout.write(execution_text(execution))

"""The fence every write of an owner goes through: a transaction in which the worker provably still holds the
process's lease. Beneath the other actions (leases, commands, recordings), importing none of them."""

from __future__ import annotations

from contextlib import contextmanager

from django.db import transaction

from executions.errors import Refused
from terminals.models import ProcessLease, Worker


class LeaseLost(Refused):
    """This worker no longer owns the process: another claim bumped the token, or the lease was released."""


@contextmanager
def fenced(execution_pk: int, worker: Worker, token: int):
    """A transaction in which this worker provably still holds the lease (row locked until commit)."""
    with transaction.atomic():
        lease = (
            ProcessLease.objects.select_for_update()
            .filter(execution_id=execution_pk, worker=worker, token=token, released_at__isnull=True)
            .first()
        )
        if lease is None:
            raise LeaseLost(f"worker {worker.worker_id} lost the lease on execution {execution_pk} (token {token})")
        yield lease

"""Heartbeats at scale: 1,000 leases on each of four workers, beating at once, measured twice in one run.

- before: the heartbeat as it was until the leases followed their worker (kept here as the baseline): every
  beat locked every lease its worker held and rewrote each one's expiry;
- after: ``actions.worker_heartbeat``: one row (the worker's) written a beat.

Both run on the same rows, the same PostgreSQL, one thread (its own connection) per worker, each beating
``BEATS`` times back to back. Figures: rows written a beat (the row counts PostgreSQL returned for its statements)
and WAL bytes a beat (the WAL position, across all four), their rate at the production interval
(TETHER_HEARTBEAT_SECONDS), and the beat's latency.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

from asgiref.sync import sync_to_async

from bench.common import Figure, summary

WORKERS = 4
LEASES_EACH = 1000


def _populate() -> list[tuple[object, dict[int, int]]]:
    from django.conf import settings
    from django.utils import timezone

    from executions.models import Backend, Evidence, Execution, Kind, Machine, State
    from terminals import actions
    from terminals.models import ProcessLease

    run = uuid.uuid4().hex[:6]
    now = timezone.now()
    workers = []
    for n in range(WORKERS):
        worker = actions.register_worker(
            worker_id=f"bench-beat-{run}-{n}", host=settings.TETHER_HOST, pid=n + 1, started_at=1, boot_id="bench",
            channel_name=f"bench-{run}-{n}",
        )  # fmt: skip
        machines = Machine.objects.bulk_create(
            Machine(name=f"beat-{run}-{n}-{i}", backend=Backend.LOCAL, ref=f"beat-{run}-{n}-{i}")
            for i in range(LEASES_EACH)
        )
        executions = Execution.objects.bulk_create(
            Execution(
                scope="bench",
                execution_id=f"beat-{run}-{n}-{i}",
                kind=Kind.TERMINAL,
                machine=machine,
                spec={},
                spec_digest="0" * 64,
                state=State.RUNNING,
                evidence=Evidence.OBSERVED,
            )
            for i, machine in enumerate(machines)
        )
        ProcessLease.objects.bulk_create(
            ProcessLease(execution=execution, worker=worker, token=1, expires_at=now + timedelta(minutes=5))
            for execution in executions
        )
        workers.append((worker, {execution.pk: 1 for execution in executions}))
    return workers


def _per_lease_heartbeat(worker, tokens: dict[int, int]) -> None:
    """The heartbeat before: lock every lease of the worker, extend each one it holds under its token."""
    from django.db import transaction
    from django.db.models.functions import Now

    from terminals.actions.leases import lease_expiry
    from terminals.models import ProcessLease, Worker, WorkerState

    with transaction.atomic():
        Worker.objects.filter(pk=worker.pk).exclude(state=WorkerState.STOPPED).update(heartbeat_at=Now())
        Worker.objects.filter(pk=worker.pk).values_list("state", flat=True).get()
        held = list(
            ProcessLease.objects.select_for_update()
            .filter(worker=worker, released_at__isnull=True)
            .values_list("pk", "execution_id", "token", "requested_action")
        )
        ours = [pk for pk, execution_pk, token, _request in held if tokens.get(execution_pk) == token]
        if ours:
            ProcessLease.objects.filter(pk__in=ours).update(expires_at=lease_expiry())


def _wal() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def _measure(beat, workers, beats: int) -> dict[str, float]:
    from django.db import connection

    latencies: list[float] = []
    rows: list[int] = []
    lock = threading.Lock()

    def beater(worker, tokens) -> None:
        mine, written = [], [0]

        def count_rows(execute, sql, params, many, context):
            result = execute(sql, params, many, context)
            if sql.lstrip()[:6].upper() in ("UPDATE", "INSERT", "DELETE"):
                written[0] += max(context["cursor"].rowcount, 0)  # rows the statement changed, as PostgreSQL says
            return result

        try:
            with connection.execute_wrapper(count_rows):
                for _ in range(beats):
                    began = time.perf_counter()
                    beat(worker, tokens)
                    mine.append((time.perf_counter() - began) * 1000)
        finally:
            connection.close()
        with lock:
            latencies.extend(mine)
            rows.append(written[0])

    wal_before = _wal()
    threads = [threading.Thread(target=beater, args=pair) for pair in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    count = beats * len(workers)
    return {"rows": sum(rows) / count, "wal": (_wal() - wal_before) / count, **summary(latencies)}


def _clean(workers) -> None:
    from executions.models import Execution, Machine
    from terminals.models import ProcessLease, Worker

    worker_pks = [worker.pk for worker, _ in workers]
    executions = list(ProcessLease.objects.filter(worker_id__in=worker_pks).values_list("execution_id", flat=True))
    ProcessLease.objects.filter(worker_id__in=worker_pks).delete()
    machines = list(Execution.objects.filter(pk__in=executions).values_list("machine_id", flat=True))
    Execution.objects.filter(pk__in=executions).delete()
    Machine.objects.filter(pk__in=machines).delete()
    Worker.objects.filter(pk__in=worker_pks).delete()


async def bench_heartbeats(ctx) -> None:
    from django.conf import settings

    from terminals import actions

    beats = 10 if ctx.quick else 50
    workers = await sync_to_async(_populate)()
    try:
        await sync_to_async(_measure)(_per_lease_heartbeat, workers, 2)  # warm both paths' plans and caches
        await sync_to_async(_measure)(actions.worker_heartbeat, workers, 2)
        before = await sync_to_async(_measure)(_per_lease_heartbeat, workers, beats)
        after = await sync_to_async(_measure)(actions.worker_heartbeat, workers, beats)
    finally:
        await sync_to_async(_clean)(workers)
    every = settings.TETHER_HEARTBEAT_SECONDS
    sized = f"{WORKERS} workers x {LEASES_EACH:,} leases, {beats} beats each at once"
    per_second = WORKERS / every
    ctx.report.add(
        Figure(
            f"heartbeat: rows written a second ({sized}, one beat every {every} s)",
            after["rows"] * per_second,
            "rows/s",
            baseline=before["rows"] * per_second,
            baseline_name="a lease row a beat (before)",
            goal="one row per worker",
            met=after["rows"] <= 1.05,
            note=f"{after['rows']:.2f} rows a beat, before {before['rows']:.0f}",
        )
    )
    ctx.report.add(
        Figure(
            "heartbeat: WAL written a second",
            after["wal"] * per_second / 1024,
            "KiB/s",
            baseline=before["wal"] * per_second / 1024,
            baseline_name="before",
            note=f"{after['wal']:.0f} B a beat, before {before['wal']:.0f} B",
        )
    )
    ctx.report.add(
        Figure(
            "heartbeat latency p50 (four workers beating at once)",
            after["p50"],
            "ms",
            baseline=before["p50"],
            baseline_name="before",
            note=f"p99 {after['p99']:.2f} ms, before {before['p99']:.2f} ms",
        )
    )

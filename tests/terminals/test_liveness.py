"""The one judge of whether a worker is gone: proof on this host by pid and start time, its own word, and on
another host only its heartbeat's silence."""

from __future__ import annotations

import signal
import subprocess
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from terminals.backends.procfs import ProcessIdentity, boot_id
from terminals.liveness import Seen, judge, silent
from terminals.models import Worker, WorkerState
from tests.bridge.harness import wait_for

pytestmark = pytest.mark.django_db


def _worker(pid: int, **fields) -> Worker:
    started = ProcessIdentity.of(pid).start_time if pid else 1
    values = {"worker_id": uuid.uuid4().hex, "host": settings.TETHER_HOST, "pid": pid or 1,
              "process_started_at": started, "boot_id": boot_id(), "heartbeat_at": timezone.now()} | fields  # fmt: skip
    return Worker.objects.create(**values)


def test_a_worker_is_gone_only_on_proof_and_frozen_or_elsewhere_is_not_gone():
    assert judge(None).seen is Seen.NO_OWNER and judge(None).proven_gone
    child = subprocess.Popen(["sleep", "60"])
    try:
        running = _worker(child.pid)
        assert (judge(running).seen, judge(running).proven_gone) == (Seen.RUNNING, False)
        child.send_signal(signal.SIGSTOP)
        wait_for(lambda: ProcessIdentity.of(child.pid).is_stopped(), timeout=5, what="the child stopped")
        frozen = judge(running)
        assert (frozen.seen, frozen.proven_gone) == (Seen.FROZEN, False)  # it may go on where it stopped
        assert "is stopped" in frozen.why
        child.send_signal(signal.SIGKILL)
        child.wait()
        gone = judge(running)
        assert (gone.seen, gone.proven_gone) == (Seen.GONE, True) and f"pid {child.pid}" in gone.why
    finally:
        child.kill()
        child.wait()
    stopped = _worker(0, state=WorkerState.STOPPED)
    assert judge(stopped).seen is Seen.STOPPED and judge(stopped).proven_gone

    # Another host: its pid says nothing here; only its heartbeat's silence past the lease TTL does.
    elsewhere = _worker(0, host="another-host")
    assert (judge(elsewhere).seen, judge(elsewhere).proven_gone) == (Seen.ELSEWHERE, False)
    assert not silent(elsewhere)
    ttl = settings.TETHER_LEASE_TTL_SECONDS
    Worker.objects.filter(pk=elsewhere.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=ttl + 5))
    assert silent(elsewhere)
    rebooted = _worker(0, boot_id="another-boot")
    assert judge(rebooted).seen is Seen.ELSEWHERE

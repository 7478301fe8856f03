"""terminal_demo: every phase proves what it claims, on tmux and on docker (exit status 0 only if all held)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from executions.models import Machine, MachineState
from tests.bridge.harness import database_url

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]


def demo(phase: str, data_dir: Path, *extra: str) -> str:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "TETHER_DATA_DIR": str(data_dir),
        "TETHER_LEASE_TTL_SECONDS": "4",
        "TETHER_HEARTBEAT_SECONDS": "1",
        # Names and labels scripts/clean-test-leftovers.sh removes if a run is interrupted.
        "TETHER_DEMO_PREFIX": "tether-test-demo",
        "TETHER_DEMO_LABEL": "tether.test=1",
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "terminal_demo", phase, *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"{phase} failed:\n{done.stdout}\n{done.stderr[-3000:]}"
    assert "NOT PROVEN" not in done.stdout
    return done.stdout


def test_demo_on_tmux_run_then_interrupt_and_recover_by_adoption(tmp_path):
    out = demo("run", tmp_path, "--backend", "tmux")
    assert "proven: the exit is known: completed with exit code 7" in out
    assert "proven: a separate command read the file back" in out
    assert "proven: the machine is marked deleted" in out

    demo("interrupt", tmp_path, "--backend", "tmux")
    out = demo("recover", tmp_path)
    assert "proven: the shell was adopted" in out
    assert "proven: the shell was launched exactly once (launch counter: 1)" in out
    demo("delete", tmp_path)
    assert not Machine.objects.exclude(state=MachineState.DELETED).filter(name__startswith="tether-test-demo").exists()


def test_demo_on_docker_interrupt_then_unknown_is_resolved(tmp_path):
    demo("interrupt", tmp_path, "--backend", "docker")
    out = demo("recover", tmp_path)
    assert "proven: nothing could observe it: the outcome is unknown" in out
    assert "proven: the slot stays held until an operator resolves it" in out
    assert "proven: resolved after Tether's own checks" in out
    assert "proven: the shell was launched exactly once (launch counter: 1)" in out
    out = demo("delete", tmp_path)
    assert "no longer exists" in out

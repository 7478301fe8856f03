"""`scripts/clean-test-leftovers.sh` (run by `make test` and `make bench`) removes what an interrupted run left
behind, and never what a running one is using: a bench started beside a running suite once killed that suite's
held shells (it killed by pattern)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.conftest import HELD_DIR

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "clean-test-leftovers.sh"


def test_cleaning_while_a_test_run_goes_on_touches_none_of_its_holders_or_directories():
    # A process named as a test shell's holder is (the pattern the script once killed by), in this run's
    # directory: this test process holds the run's shared lock, as every test process does.
    Path(HELD_DIR).mkdir(parents=True, exist_ok=True)
    mine = Path(HELD_DIR) / "kept-by-a-running-suite"
    mine.mkdir(exist_ok=True)
    holder = subprocess.Popen(["bash", "-c", f'exec -a "tether-holder serve {mine}" sleep 60'])
    try:
        time.sleep(0.2)
        cleaned = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60)
        assert cleaned.returncode == 0, cleaned.stderr
        assert "a test run is going on here" in cleaned.stdout
        time.sleep(0.2)
        assert holder.poll() is None, "the running suite's holder was killed"
        assert mine.is_dir(), "the running suite's holder directory was removed"
    finally:
        holder.kill()
        holder.wait()
        mine.rmdir()

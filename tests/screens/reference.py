"""The page's emulator as the reference: bytes written into @xterm/headless (xterm_screen.cjs), the screen
read back whole (both buffers cell by cell, cursor, scroll region, title, modes)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).with_name("xterm_screen.cjs")
ROOT = Path(__file__).resolve().parents[2]


def xterm_screen(data: bytes, cols: int = 80, rows: int = 24) -> dict:
    done = subprocess.run(
        ["node", str(SCRIPT), str(cols), str(rows)], input=data, capture_output=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return json.loads(done.stdout)


def differences(page: dict, truth: dict) -> list[str]:
    """Where the page's screen is not the truth's, said row by row (empty: the same, cell by cell)."""
    found = []
    for key in sorted(set(page) | set(truth)):
        if key == "modes":
            for mode in sorted(truth[key]):
                if page[key].get(mode) != truth[key][mode]:
                    found.append(f"mode {mode}: {page[key].get(mode)!r}, truth {truth[key][mode]!r}")
        elif key in ("normal", "alternate") and page[key] is not None and truth[key] is not None:
            for row, (mine, real) in enumerate(zip(page[key], truth[key], strict=True)):
                if mine != real:
                    found.append(f"{key} row {row}: {mine!r}, truth {real!r}")
        elif page[key] != truth[key]:
            found.append(f"{key}: {page[key]!r}, truth {truth[key]!r}")
    return found

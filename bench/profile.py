"""Sampling profiles of daphne and the owner worker while a benchmark runs (py-spy, no code changes).

    .venv/bin/python -m bench.run --only echo --profile /tmp/profiles

writes ``<benchmark>-<process>.folded`` (collapsed stacks, for any flame-graph viewer) and prints where
each process spent its samples: the functions with the most samples of their own, and the Tether
functions with the most samples including what they called. ``--only embedded`` samples the one
``tether_serve`` process while it echoes.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

SAMPLES_PER_SECOND = 250
OURS = re.compile(r"\((terminals|executions|config)/")  # py-spy names frames by path relative to sys.path


@contextlib.contextmanager
def profiled(directory: Path, benchmark: str, processes: dict[str, int]):
    directory.mkdir(parents=True, exist_ok=True)
    spies = {}
    for name, pid in processes.items():
        out = directory / f"{benchmark}-{name}.folded"
        spies[name] = (
            subprocess.Popen(
                [
                    str(Path(sys.executable).with_name("py-spy")),
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    str(SAMPLES_PER_SECOND),
                    "--format",
                    "raw",
                    "--nonblocking",
                    "--gil",  # only the thread holding the GIL: where the process's Python time goes
                    "--output",
                    str(out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            ),
            out,
        )
    try:
        yield
    finally:
        for name, (spy, out) in spies.items():
            spy.send_signal(signal.SIGINT)
            try:
                spy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                spy.kill()
            if out.exists():
                print(summarise(out, name), flush=True)


def _frames(line: str) -> tuple[list[str], int]:
    stack, _, count = line.rpartition(" ")
    return stack.split(";"), int(count) if count.isdigit() else 0  # py-spy may write a garbled frame


def summarise(path: Path, name: str, top: int = 12) -> str:
    own, inclusive, total = Counter(), Counter(), 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        frames, count = _frames(line)
        total += count
        own[_short(frames[-1])] += count
        for frame in {_short(f) for f in frames if OURS.search(f)}:
            inclusive[frame] += count
    if not total:
        return f"  profile {name}: no samples"
    lines = [f"  profile {name}: {total} samples; own time:"]
    lines += [f"    {count * 100 / total:5.1f}%  {frame}" for frame, count in own.most_common(top)]
    lines.append(f"  profile {name}: Tether code including callees:")
    lines += [f"    {count * 100 / total:5.1f}%  {frame}" for frame, count in inclusive.most_common(top)]
    return "\n".join(lines)


def _short(frame: str) -> str:
    """``function (path/to/file.py:line)`` -> ``function (file.py)``: one entry per function."""
    function, _, where = frame.partition(" (")
    filename = where.rstrip(")").rsplit(":", 1)[0].rsplit("/", 2)
    return f"{function} ({'/'.join(filename[-2:])})"


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        print(summarise(Path(argument), Path(argument).stem))

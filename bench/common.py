"""What every benchmark shares: Django on a benchmark database, real processes, a raw-PTY baseline, statistics.

Benchmarks report figures; they never fail on a slow machine. Each figure is measured in the same run as
its baseline, on the same machine, and reported as an absolute and as a ratio.
"""

from __future__ import annotations

import asyncio
import os
import pty
import re
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH_DB = os.environ.get("BENCH_DATABASE_URL", "postgres:///tether_bench?host=/var/run/postgresql")


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ["DATABASE_URL"] = BENCH_DB
    os.environ.setdefault("TETHER_DB_IDLE_TRANSACTION_SECONDS", "0")
    os.environ.setdefault("TETHER_SESSIONS_PER_USER", "100000")  # density opens hundreds for one user
    sys.path.insert(0, str(ROOT))
    name = BENCH_DB.split("///")[1].split("?")[0]
    subprocess.run(["dropdb", "-h", "/var/run/postgresql", "--if-exists", "--force", name], check=True)
    subprocess.run(["createdb", "-h", "/var/run/postgresql", name], check=True)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


# --- figures -------------------------------------------------------------------------------------


@dataclass
class Figure:
    name: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    goal: str = ""
    met: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> str:
        if not self.baseline:
            return ""
        return f"{self.value / self.baseline:.2f}x"


@dataclass
class Report:
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        base = (
            f" (baseline {figure.baseline_name} {fmt(figure.baseline)} {figure.unit}, {figure.ratio})"
            if (figure.baseline)
            else ""
        )
        goal = f" goal {figure.goal}: {'met' if figure.met else 'NOT met'}" if figure.goal else ""
        print(f"  {figure.name}: {fmt(figure.value)} {figure.unit}{base}{goal} {figure.note}".rstrip(), flush=True)
        return figure

    def markdown(self) -> str:
        rows = ["| figure | value | baseline | ratio | goal | met |", "|---|---|---|---|---|---|"]
        for f in self.figures:
            baseline = f"{f.baseline_name}: {fmt(f.baseline)} {f.unit}" if f.baseline else ""
            met = "" if f.met is None else ("yes" if f.met else "**no**")
            note = f" ({f.note})" if f.note else ""
            rows.append(f"| {f.name}{note} | {fmt(f.value)} {f.unit} | {baseline} | {f.ratio} | {f.goal} | {met} |")
        return "\n".join(rows)


def median_of(runs: list[list[Figure]]) -> list[Figure]:
    """One benchmark's figures from several runs (each its own baselines): each figure is the run whose ratio to its
    baseline is the median (its value's, where it has no baseline or its goal is not said against the baseline: "≤
    20 ms"), so its goal is judged on that run; every run's is shown."""
    if len({len(figures) for figures in runs}) != 1:  # a run that broke off: its figures do not line up
        return [replace(f, note=f"{f.note}; the last of {len(runs)} runs (they differ in figures)") for f in runs[-1]]
    merged = []
    for same in zip(*runs, strict=True):
        relative = same[0].baseline and (not same[0].goal or re.search(r"\dx\b|%", same[0].goal))
        ordered = sorted(same, key=lambda f: f.value / f.baseline if relative and f.baseline else f.value)
        median = ordered[(len(ordered) - 1) // 2]
        shown = ", ".join(f.ratio if relative and f.baseline else f"{fmt(f.value)} {f.unit}".strip() for f in same)
        note = f"median of {len(same)} runs: {shown}"
        merged.append(replace(median, note=f"{median.note}; {note}" if median.note else note))
    return merged


def fmt(value: float | None) -> str:
    if value is None:
        return ""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(samples, 50),
        "p95": percentile(samples, 95),
        "p99": percentile(samples, 99),
        "mean": statistics.fmean(samples),
    }


def redis_commands(url: str) -> int:
    """Commands this Redis has run since it started (all clients')."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.info("stats")["total_commands_processed"])
    finally:
        client.close()


# --- processes ---------------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _stat(path: Path) -> tuple[int, float]:
    """A process's parent and the CPU seconds it has used, from its ``/proc/PID/stat``."""
    fields = path.read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    return _stat(Path(f"/proc/{pid}/stat"))[1]


def machine_cpu() -> tuple[float, float]:
    """CPU seconds the whole machine has been busy (every core, every process: /proc/stat), and seconds elapsed
    on all its cores (busy or idle)."""
    fields = [int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - fields[3] - fields[4]) / tick, sum(fields) / tick  # (less idle and iowait)


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and every process under it (a worker's emulator), those that ended not counted."""
    parents, seconds = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)], seconds[int(stat.parent.name)] = _stat(stat)
        except OSError:
            continue  # ended meanwhile
    tree, grew = {pid}, True
    while grew:
        more = {child for child, parent in parents.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(seconds.get(member, 0.0) for member in tree)


def postgres_cpu() -> dict[int, float]:
    """CPU seconds of each PostgreSQL process (the server's and each connection's), by pid."""
    seconds = {}
    for pid in subprocess.run(["pgrep", "-x", "postgres"], capture_output=True, text=True).stdout.split():
        try:
            seconds[int(pid)] = cpu_seconds(int(pid))
        except OSError:
            pass  # a connection that ended meanwhile
    return seconds


def postgres_since(before: dict[int, float]) -> float:
    """PostgreSQL's CPU seconds since ``before`` (a connection that ended meanwhile counts for nothing)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in postgres_cpu().items())


def machine_busy() -> float:
    """CPU seconds all cores of this machine have spent busy since boot: user, nice, system, irq and softirq
    (not idle, not waiting on I/O, not stolen by the hypervisor for another machine)."""
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in Path("/proc/stat").read_text().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def redis_pid(url: str) -> int:
    import redis

    return int(redis.Redis.from_url(url).info("server")["process_id"])


def redis_rss_kib(url: str) -> int:
    import redis

    return int(redis.Redis.from_url(url).info("memory")["used_memory_rss"]) // 1024


class RawPty:
    """The baseline: a program on a PTY read and written straight from this process."""

    def __init__(self, argv: list[str]):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child
            os.execvp(argv[0], argv)

    def write(self, data: bytes) -> None:
        os.write(self.fd, data)

    def read(self, size: int = 65536) -> bytes:
        try:
            return os.read(self.fd, size)
        except OSError:
            return b""

    def close(self) -> None:
        try:
            os.kill(self.pid, 9)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        os.close(self.fd)


async def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(interval)
    raise TimeoutError("benchmark precondition not reached")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"

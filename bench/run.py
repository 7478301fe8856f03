"""Run the benchmark suite and write docs/benchmarks.md.

    make bench                      # quick sizes (a few minutes)
    make bench BENCH_ARGS=--full    # the issues' sizes (200 MB, 5,000 samples, 10,000 sessions, 60 s stall), 3 runs
    .venv/bin/python -m bench.run --full --only churn_hosts --size churn_hosts=1000   # a size of one's own
    .venv/bin/python -m bench.run --only echo --runs 3   # each figure the median of 3 runs, the three shown
    .venv/bin/python -m bench.run --only echo,throughput

Figures are reported, never asserted: a slow machine gives slow numbers, not a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from bench.common import ROOT, Figure, Report, cpu_seconds, median_of, setup_django, summary
from bench.profile import profiled


async def embedded_echo(ctx, samples: int, profile: Path | None = None) -> None:
    """The same echo through `tether_serve`: one process, in-memory channel layer, no Redis hop."""
    from asgiref.sync import sync_to_async

    from bench.sessions import (
        RAW_CAT,
        close_session,
        echo_latency,
        machine_for,
        terminado_echo_summary,
        terminal_for,
    )
    from tests.bridge.harness import Viewer, free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(ALLOWED_HOSTS="127.0.0.1,localhost", TETHER_HEARTBEAT_SECONDS="1")
    serve = subprocess.Popen(
        [sys.executable, "manage.py", "tether_serve", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        machine = await sync_to_async(machine_for)("local")
        session = await sync_to_async(terminal_for)(machine, ctx.user, RAW_CAT)
        for _ in range(300):
            try:
                viewer = await Viewer.open(port, session.id, ctx.cookie)
                break
            except OSError:
                await asyncio.sleep(0.1)
        await viewer.attach()
        await viewer.read_until(b"READY", timeout=30)
        await echo_latency(viewer, 50)
        before = cpu_seconds(serve.pid)
        with profiled(profile, "embedded", {"tether_serve": serve.pid}) if profile else contextlib.nullcontext():
            stats = summary(await echo_latency(viewer, samples))
        cpu_ms = (cpu_seconds(serve.pid) - before) * 1000 / samples
        await viewer.close()
        await close_session(session)  # while tether_serve runs: its held shell would outlive it
        peer = await terminado_echo_summary(ctx, samples)
        for p in ("p50", "p99"):
            ctx.report.add(
                Figure(
                    f"echo {p}, embedded (tether_serve, in-memory layer; {samples} samples)",
                    stats[p],
                    "ms",
                    peer[p],
                    "terminado",
                    "≤ 1.3x terminado",
                    stats[p] <= 1.3 * peer[p],
                )
            )
        # Where an echo's time goes: one process each, so their CPU per keystroke compares directly.
        ctx.report.add(
            Figure(
                "CPU per keystroke echo, embedded (tether_serve's one process)",
                cpu_ms,
                "ms",
                ctx.peers["echo_cpu"].get("terminado"),
                "terminado's server",
            )
        )
    finally:
        serve.terminate()
        serve.wait(timeout=30)


async def main(args) -> Report:
    from asgiref.sync import sync_to_async
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from bench.suite import BENCHMARKS, Context
    from tests.bridge.harness import Stack, session_cookie, start_container

    report = Report()
    # A superuser: access is denied by default (docs/access.md), and the bench opens shells on machines it makes.
    user = await sync_to_async(get_user_model().objects.create_user)("bench", is_staff=True, is_superuser=True)
    cookie = await sync_to_async(session_cookie)(user)
    stack = Stack(worker_poll=0.5)  # the worker's default, not the tests' quick poll
    stack.extra_env.update(TETHER_SESSIONS_PER_USER="100000", TETHER_STRIKE_LIMIT="100000")
    # No session closed for its output (a session's limits are set where it is opened: here): --full's screens
    # send 1.2 GB through each of its two shells, past the 1 GiB default.
    settings.TETHER_OUTPUT_LIMIT_BYTES = 1 << 40
    for setting in args.set or []:  # e.g. --set TETHER_CHANNEL_LAYER=pubsub to compare a configuration
        key, _, value = setting.partition("=")
        stack.extra_env[key] = value
    container, _ = start_container("tether-test-bench")
    workdir = Path(tempfile.mkdtemp(prefix="tether-bench-"))
    chosen = args.only.split(",") if args.only else [*BENCHMARKS, "embedded"]
    sizes = {name: int(value) for name, _, value in (size.partition("=") for size in args.size or [])}
    ctx = Context(stack, user, cookie, report, not args.full, workdir, sizes=sizes)
    runs = runs_of(args)
    # Per run: each benchmark's figures, and the peers measured in that run (each run against its own terminado).
    measured: list[dict[str, list[Figure]]] = [{} for _ in range(runs)]
    peers: list[dict] = [{} for _ in range(runs)]

    async def measure(run: int, name: str, call) -> None:
        # The run's figures so far (a benchmark may compare with an earlier one's), its notes the run's notes.
        ctx.report = Report([f for figures in measured[run].values() for f in figures], report.notes)
        ctx.peers, start = peers[run], len(ctx.report.figures)
        began = time.monotonic()
        try:
            await call()
        except Exception as error:  # a benchmark that breaks is reported, and the rest still run
            report.notes.append(f"{name} did not complete (run {run + 1}): {error!r}")
            print(f"  {name} did not complete: {error!r}", flush=True)
            traceback.print_exc()
        measured[run][name] = ctx.report.figures[start:]
        print(f"  ({time.monotonic() - began:.0f} s)", flush=True)
        report.figures = merged(measured)
        write_markdown(report, args, Path(args.out))  # what is measured so far survives an interrupted run

    try:
        await sync_to_async(stack.start_daphne)()
        await sync_to_async(stack.start_worker)("local,tmux,docker")
        for run in range(runs):
            for name in chosen:
                if name == "embedded":
                    continue
                print(f"[{name}]" + (f" run {run + 1} of {runs}" if runs > 1 else ""), flush=True)
                processes = {"daphne": stack.daphnes[0].pid, "worker": stack.workers[-1].pid}
                with profiled(Path(args.profile), name, processes) if args.profile else contextlib.nullcontext():
                    args_of = (ctx, container) if name in WITH_CONTAINER else (ctx,)
                    await measure(run, name, lambda b=BENCHMARKS[name], a=args_of: b(*a))
    finally:
        await sync_to_async(stack.stop)()
        if container:
            subprocess.run(["docker", "rm", "-f", container], capture_output=True)
        for socket in Path(f"/tmp/tmux-{os.getuid()}").glob("tether-bench-*"):  # the benchmarks' tmux servers
            subprocess.run(["tmux", "-S", str(socket), "kill-server"], capture_output=True)
            socket.unlink(missing_ok=True)
    if "embedded" in chosen:
        profile = Path(args.profile) if args.profile else None
        for run in range(runs):
            print("[embedded]" + (f" run {run + 1} of {runs}" if runs > 1 else ""), flush=True)
            await measure(run, "embedded", lambda: embedded_echo(ctx, 1000 if not args.full else 5000, profile))
    return report


WITH_CONTAINER = ("throughput", "holder")


def runs_of(args) -> int:
    return args.runs or (3 if args.full else 1)


def merged(measured: list[dict[str, list[Figure]]]) -> list[Figure]:
    """The figures of every benchmark measured so far, in order; a benchmark run several times: the median run's."""
    names = list(dict.fromkeys(name for run in measured for name in run))
    figures = []
    for name in names:
        runs = [run[name] for run in measured if name in run]
        figures += median_of(runs) if len(runs) > 1 else runs[0]
    return figures


LAYER_NAMES = {
    "pubsub": "PUBLISH, Tether's own pub/sub layer",
    "channels-pubsub": "PUBLISH, channels-redis's pub/sub layer",
    "core": "lists, channels-redis's core layer",
}


PATHS = {True: "the direct link (issue 45), Redis for wake-ups and control", False: "Redis"}


def links_on(args) -> bool:
    from django.conf import settings

    chosen = dict(setting.partition("=")[::2] for setting in args.set or [])
    return chosen.get("TETHER_LINKS", str(int(settings.TETHER_LINKS))) not in ("0", "false", "False")


def write_markdown(report: Report, args, path: Path) -> None:
    from django.conf import settings

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    body = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`python -m bench.run`); the figures below are from the last run on this machine.",
        "Each figure is measured in the same run as its baseline. They are reports, never pass/fail tests.",
        "",
        f"- run: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {'full' if args.full else 'quick'} sizes"
        + (f", with {', '.join(args.set)}" if args.set else "")
        + (f", each figure the median of {runs_of(args)} runs" if runs_of(args) > 1 else ""),
        f"- machine: {os.cpu_count()} cores ({cpu}), Linux {platform.release()}, Python {platform.python_version()}",
        f"- path: WebSocket client → daphne (consumer) → {PATHS[links_on(args)]}"
        f" ({LAYER_NAMES[settings.TETHER_CHANNEL_LAYER]}) → owner worker → process",
        "",
        report.markdown(),
        "",
    ]
    if report.notes:
        body += ["## Notes from this run", "", *[f"- {note}" for note in report.notes], ""]
    existing = path.read_text() if path.exists() else ""
    marker = "<!-- analysis -->"
    analysis = existing[existing.index(marker) :] if marker in existing else f"{marker}\n"
    path.write_text("\n".join(body) + "\n" + analysis)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="the issue's sizes (slow)")
    parser.add_argument(
        "--only",
        help="comma-separated: layers,echo,echo_loaded,echo_other_layer,throughput,holder,commands,recordings,screens,"
        "stalled,reconnect,recovery,density,churn,heartbeats,costs,churn_hosts,embedded",
    )
    parser.add_argument(
        "--runs", type=int, help="run each benchmark N times and judge each figure on the median run (3 with --full)"
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument("--profile", metavar="DIR", help="sample daphne and the worker with py-spy into DIR")
    parser.add_argument("--set", action="append", metavar="NAME=VALUE", help="a setting for daphne and the worker")
    parser.add_argument(
        "--size",
        action="append",
        metavar="NAME=N",
        help="a size instead of quick or full: density.local, density.tmux, churn_hosts",
    )
    args = parser.parse_args()
    setup_django()
    report = asyncio.run(main(args))
    write_markdown(report, args, Path(args.out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    cli()

"""What keeping every shell's screen costs (terminals/screen, docs/protocol.md): output through Tether with the
worker keeping its screen, against the same shell with no screens kept, in the same run; plain text (base64) and
coloured text (a colour every few characters); then the emulator's memory per shell and the time a screen takes to
produce.

The two kinds of shell run on two workers started for them, one with TETHER_SCREEN_SCROLLBACK=200 and
one with 0, each under a host name of its own, so that only it claims them (machines run on their host's workers);
the rest of the path is the same stack.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from pathlib import Path

from asgiref.sync import sync_to_async

from bench.commands import _rate, close_pair, open_on
from bench.common import Figure, cpu_seconds, machine_cpu, tree_cpu, unique
from bench.sessions import MIB, Context
from bench.throughput import make_data

EMULATOR = Path(__file__).resolve().parents[1] / "terminals" / "screen"
WARM = 16 * MIB  # output through each shell before it is measured
ROUNDS = 5  # each kind's rate varies by a fifth from one round to the next on a 2-core machine: the median of 5


def _machine(host: str | None):
    from executions.actions import Actor, add_machine

    actor = Actor.command("bench")
    return add_machine(name=unique("bench-screens"), backend="local", scope="bench", actor=actor, host=host)


def make_coloured(path: Path, size: int) -> None:
    """``size`` bytes of lines whose words change colour every few characters (as `ls --color` or a build log)."""
    if path.exists() and path.stat().st_size == size:
        return
    words = [f"\x1b[3{n % 8}mword{n}\x1b[0m " for n in range(64)]
    line = ("".join(words[:12]) + "\r\n").encode()
    with open(path, "wb") as out:
        out.write((line * (size // len(line) + 1))[:size])


MEASURE = r"""
const { Terminal } = require("@xterm/headless");
const { feed } = require("./feed.cjs");
const { rebuild } = require("./serialize.cjs");
const shells = [];
const before = process.memoryUsage().heapUsed;
for (let i = 0; i < COUNT; i++) {
  const shell = { term: new Terminal({ cols: 80, rows: 24, scrollback: SCROLLBACK, allowProposedApi: true }),
    recent: Buffer.alloc(0), scrollback: SCROLLBACK };
  feed(shell, Buffer.from("$ ls\r\n" + "file-name.txt  ".repeat(40) + "\r\n$ "));
  shells.push(shell);
}
global.gc && global.gc();
const idle = (process.memoryUsage().heapUsed - before) / COUNT;
// A shell with a full scrollback of coloured lines and a full-screen program in the alternate screen.
const busy = shells[0];
for (let i = 0; i < 400; i++) {
  feed(busy, Buffer.from(`\x1b[3${i % 8}mline ${i} of the log\x1b[0m ${"x".repeat(50)}\r\n`));
}
const program = "\x1b[7m top \x1b[0m\r\n" + "row of the program \x1b[32mok\x1b[0m\r\n".repeat(22);
feed(busy, Buffer.from("\x1b[?1049h\x1b[H" + program));
const times = [];
let size = 0;
for (let i = 0; i < 50; i++) {
  const began = process.hrtime.bigint();
  size = Buffer.byteLength(rebuild(busy.term, { scrollback: SCROLLBACK }));
  times.push(Number(process.hrtime.bigint() - began) / 1e6);
}
times.sort((a, b) => a - b);
process.stdout.write(JSON.stringify({ idle, median: times[25], size }));
"""


def emulator_costs(scrollback: int = 200, count: int = 200) -> dict:
    """Heap per idle shell (a prompt and a line of output), and the time to rebuild a busy one's screen."""
    script = MEASURE.replace("COUNT", str(count)).replace("SCROLLBACK", str(scrollback))
    done = subprocess.run(
        ["node", "--expose-gc", "-e", script], capture_output=True, cwd=EMULATOR, check=True, timeout=120
    )
    return json.loads(done.stdout)


async def bench_screens(ctx: Context) -> None:
    hosts = {kind: unique(f"bench-screens-{kind}") for kind in ("off", "kept")}
    started = {
        kind: await sync_to_async(ctx.stack.start_worker)(
            "local", {"TETHER_SCREEN_SCROLLBACK": "200" if kind == "kept" else "0", "TETHER_HOST": host}
        )
        for kind, host in hosts.items()
    }
    opened = {}
    size = (50 if ctx.quick else 200) * MIB
    name = f"bench-{size // MIB}MB"
    files = {"plain": ctx.workdir / f"{name}.b64", "coloured": ctx.workdir / f"{name}.ansi"}
    make_data(files["plain"], size)
    make_coloured(files["coloured"], size)
    try:
        for kind, host in hosts.items():
            opened[kind] = await open_on(ctx, await sync_to_async(_machine)(host))
        rates = {(text, kind): [] for text in files for kind in opened}
        cpu = {(text, kind): [] for text in files for kind in opened}  # the worker's (and its emulator's) per MB
        emulator = {text: [] for text in files}  # of which the emulator's (every process under the worker)
        machine = {(text, kind): [] for text in files for kind in opened}  # (all CPU per MB, the share busy)
        workers = {kind: worker.pid for kind, worker in started.items()}
        # A round not counted first: both workers (and the kept one's emulator) were just started, and a shell's
        # first output grows its buffers; what a running worker pays per MB is the figure.
        for path in files.values():
            warm = path.with_suffix(".warm")
            with path.open("rb") as source:
                warm.write_bytes(source.read(WARM))
            for viewer, _ in opened.values():
                await _rate(viewer, str(warm))
        for _ in range(ROUNDS):
            for text, path in files.items():
                for kind, (viewer, _) in opened.items():
                    before = tree_cpu(workers[kind]), cpu_seconds(workers[kind]), machine_cpu()
                    rates[text, kind].append(await _rate(viewer, str(path)))
                    busy = machine_cpu()
                    spent = tree_cpu(workers[kind]) - before[0], cpu_seconds(workers[kind]) - before[1]
                    machine[text, kind].append(
                        (
                            (busy[0] - before[2][0]) * 1000 / (size / MIB),
                            (busy[0] - before[2][0]) / (busy[1] - before[2][1]),
                        )
                    )
                    cpu[text, kind].append(spent[0] * 1000 / (size / MIB))
                    if kind == "kept":
                        emulator[text].append((spent[0] - spent[1]) * 1000 / (size / MIB))
    finally:
        await close_pair(ctx, opened, *started.values())
    for text in files:
        kept, off = rates[text, "kept"], rates[text, "off"]
        ctx.report.add(
            Figure(
                f"screens: output of a shell whose screen is kept, {text} text ({size // MIB} MB through Tether)",
                statistics.median(kept),
                "MB/s",
                statistics.median(off),
                "the same shell, no screen kept",
                note=f"median of {ROUNDS} each, alternating: kept {', '.join(f'{r:.1f}' for r in kept)}; "
                f"off {', '.join(f'{r:.1f}' for r in off)}",
                goal="≥ 0.9x",
                met=statistics.median(kept) >= 0.9 * statistics.median(off),
            )
        )
        kept, off = cpu[text, "kept"], cpu[text, "off"]
        ctx.report.add(
            Figure(
                f"screens: CPU of the worker and its emulator per MB of {text} text, screen kept",
                statistics.median(kept),
                "ms/MB",
                statistics.median(off),
                "the same shell's worker, no screen kept",
                note=f"median of {ROUNDS}: kept {', '.join(f'{c:.1f}' for c in kept)} (the emulator "
                f"{', '.join(f'{c:.1f}' for c in emulator[text])}); off {', '.join(f'{c:.1f}' for c in off)}",
            )
        )
        kept, off = machine[text, "kept"], machine[text, "off"]
        ctx.report.add(
            Figure(
                f"screens: CPU of the whole machine per MB of {text} text, screen kept",
                statistics.median(spent for spent, _ in kept),
                "ms/MB",
                statistics.median(spent for spent, _ in off),
                "the same, no screen kept",
                note=f"median of {ROUNDS}: kept {', '.join(f'{c:.1f}' for c, _ in kept)}; off "
                f"{', '.join(f'{c:.1f}' for c, _ in off)}; its cores busy {', '.join(f'{s:.0%}' for _, s in kept)} "
                f"kept, {', '.join(f'{s:.0%}' for _, s in off)} off",
            )
        )
    began = time.perf_counter()
    costs = emulator_costs()
    ctx.report.add(
        Figure(
            "screens: the emulator's heap per idle shell (80x24, 200 lines of scrollback, a prompt and a line)",
            costs["idle"] / 1024,
            "KiB",
            note=f"measured over 200 shells in {time.perf_counter() - began:.1f} s",
        )
    )
    ctx.report.add(
        Figure(
            "screens: time to produce a screen (full scrollback and a program in the alternate screen)",
            costs["median"],
            "ms",
            note=f"median of 50; the screen is {costs['size'] / 1024:.0f} KiB",
        )
    )

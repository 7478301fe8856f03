"""The contract every process backend passes, run against local PTY, tmux and docker exec alike."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import time
import uuid

import pytest

from terminals.backends.base import Exit, Process, SpawnSpec, Status
from terminals.backends.procfs import ProcessIdentity, find_tree
from tests.backends.conftest import left_behind, make_tags, settled_exec_processes, wait_until

pytestmark = pytest.mark.backend_contract


async def read_until(process: Process, needle: bytes, timeout: float = 10.0) -> bytes:
    seen = b""

    async def pump():
        nonlocal seen
        while needle not in seen:
            chunk = await process.read()
            if not chunk:
                raise AssertionError(f"output ended before {needle!r}; got {seen[-500:]!r}")
            seen += chunk

    try:
        await asyncio.wait_for(pump(), timeout)
    except TimeoutError:
        raise AssertionError(f"{needle!r} not seen within {timeout}s; got {seen[-500:]!r}") from None
    return seen


async def drain(process: Process, timeout: float = 10.0) -> bytes:
    """Everything until the output ends."""
    chunks = []

    async def pump():
        while chunk := await process.read():
            chunks.append(chunk)

    await asyncio.wait_for(pump(), timeout)
    return b"".join(chunks)


def shell(*script: str, cols: int = 80, rows: int = 24) -> SpawnSpec:
    return SpawnSpec(argv=("/bin/sh", "-c", "; ".join(script)) if script else ("/bin/sh",), cols=cols, rows=rows)


async def test_every_byte_value_comes_through_as_written(backend):
    """Output byte for byte, whatever it is: every byte value, and text that looks like tmux's own escapes
    (a backslash before three digits, which tmux's control mode sends as \\134 and the digits)."""
    payload = bytes(range(256)) + b"\\015 \\134\\\\012 \\777 \\01 end\\"
    octal = "".join(f"\\{byte:03o}" for byte in payload)
    process = await backend.spawn(shell("stty raw -echo -opost", f"printf 'BEGIN{octal}END'"), make_tags())
    try:
        out = await drain(process)
        assert out[out.index(b"BEGIN") + 5 : out.rindex(b"END")] == payload
    finally:
        await process.terminate(grace=0.5)


async def test_echo_round_trip(backend):
    process = await backend.spawn(shell(), make_tags())
    try:
        await process.write(b"echo hel''lo-$((6*7))\n")
        await read_until(process, b"hello-42")
    finally:
        await process.terminate(grace=0.5)


async def test_non_utf8_bytes_arrive_intact(backend):
    process = await backend.spawn(shell("printf 'start:\\377\\376\\200\\001:end'"), make_tags())
    output = await drain(process)
    assert b"start:\xff\xfe\x80\x01:end" in output
    await process.wait()


async def test_the_program_runs_in_the_given_directory_with_the_given_environment(backend):
    # /etc: in the container and on the host, and no backend's default directory.
    script = 'printf "cwd=[%s] v=[%s]" "$(pwd)" "$TETHER_TEST_VALUE"'
    spec = SpawnSpec(argv=("/bin/sh", "-c", script), env={"TETHER_TEST_VALUE": "two words; $HOME"}, cwd="/etc")
    process = await backend.spawn(spec, make_tags())
    assert b"cwd=[/etc] v=[two words; $HOME]" in await drain(process)
    assert (await asyncio.wait_for(process.wait(), 10)).code == 0


async def test_spawn_size_and_resize_are_seen_by_stty(backend):
    process = await backend.spawn(shell(cols=91, rows=33), make_tags())
    try:
        await process.write(b"stty size\n")
        await read_until(process, b"33 91")
        await process.resize(120, 40)
        await process.write(b"stty size\n")
        await read_until(process, b"40 120")
    finally:
        await process.terminate(grace=0.5)


async def test_exit_code_is_observed(backend):
    process = await backend.spawn(shell("echo bye; exit 7"), make_tags())
    await read_until(process, b"bye")
    exit = await asyncio.wait_for(process.wait(), 10)
    assert exit == Exit(code=7, signal=None, source=exit.source)
    assert exit.source  # where the exit came from is always said


async def test_ctrl_c_interrupts_sleep(backend):
    process = await backend.spawn(shell(), make_tags())
    seen = bytearray()

    async def pump():
        while chunk := await process.read():
            seen.extend(chunk)

    async def shown(needle: bytes, timeout: float) -> bool:
        deadline = asyncio.get_running_loop().time() + timeout
        while needle not in seen:
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    reader = asyncio.create_task(pump())
    try:
        await process.write(b"echo ready-$((3+4)); sleep 30; echo slept\n")
        assert await shown(b"ready-7", 10), bytes(seen[-500:])
        await process.write(b"\x03")
        await process.write(b"echo after-$((1+1))\n")
        assert await shown(b"after-2", 5), f"Ctrl-C did not interrupt sleep: {bytes(seen[-500:])!r}"
        assert b"\nslept\r\n" not in seen  # the echo of the typed line holds "echo slept"; the output never
    finally:
        reader.cancel()
        await process.terminate(grace=0.5)


async def read_count(read_place_file, path: str) -> int:
    text = await asyncio.to_thread(read_place_file, path)
    return int(text) if text and text.strip().isdigit() else 0


async def test_terminate_ends_a_detached_grandchild(backend, read_place_file, request):
    count = f"/tmp/tether-count-{uuid.uuid4().hex[:8]}"
    # A counter, not a clock: busybox's date has no %N, so in docker a nanosecond timestamp moved once a
    # second and a check over half a second passed about half the time with the grandchild still alive.
    counter = f"i=0; while :; do i=$((i+1)); echo $i > {count}; sleep 0.1; done"
    tags = make_tags()
    process = await backend.spawn(shell(f"setsid sh -c '{counter}' & echo started; sleep 1000"), tags)
    try:
        await read_until(process, b"started")
        async with asyncio.timeout(10):
            while not (first := await read_count(read_place_file, count)):
                await asyncio.sleep(0.05)
            while await read_count(read_place_file, count) <= first:
                await asyncio.sleep(0.1)  # counting: the grandchild is alive
        await asyncio.wait_for(process.terminate(grace=0.5), 30)
        settled = await read_count(read_place_file, count)
        await asyncio.sleep(1.5)  # 15 counts for a grandchild that survived
        assert await read_count(read_place_file, count) == settled, "the detached grandchild still counts"
        assert left_behind(tags.marker) == []
        if backend.name == "docker":
            assert await settled_exec_processes(request.getfixturevalue("container")) == []
    finally:
        for survivor in left_behind(tags.marker):
            survivor.signal(signal.SIGKILL)
        if backend.name != "docker":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(count)


def comm(process: ProcessIdentity) -> str:
    try:
        with open(f"/proc/{process.pid}/comm") as name:
            return name.read().strip()
    except OSError:
        return ""


async def test_terminate_kills_a_tree_that_ignores_hup_and_term_and_returns_once_it_is_gone(backend, request):
    stubborn = "while :; do sleep 0.1; done"
    script = f"trap '' HUP TERM; ({stubborn}) & setsid sh -c '{stubborn}' & echo ready; {stubborn}"
    tags = make_tags()
    process = await backend.spawn(shell(script), tags)
    try:
        await read_until(process, b"ready")
        # The shell, its subshell and the detached one (their sleeps come and go).
        tree = wait_until(
            lambda: len(shells := [p for p in find_tree(marker=tags.marker) if comm(p) == "sh"]) == 3 and shells
        )
        started = time.monotonic()
        exit = await asyncio.wait_for(process.terminate(grace=0.5), 30)
        assert time.monotonic() - started >= 0.5  # SIGKILL only after the grace period
        assert [p for p in tree if p.is_alive()] == []
        assert left_behind(tags.marker) == []
        # How the shell ended, as each backend's trustworthy source reports a SIGKILL: a plain docker exec only
        # as a wait status it cannot tell from exit 137 (a holder saw the signal itself).
        assert exit == (
            Exit(code=128 + signal.SIGKILL, source=exit.source, ambiguous=True)
            if backend.name == "docker" and process.handle.holder is None
            else Exit(signal=signal.SIGKILL, source=exit.source)
        )
        if backend.name == "docker":
            assert await settled_exec_processes(request.getfixturevalue("container")) == []
    finally:
        for survivor in left_behind(tags.marker):
            survivor.signal(signal.SIGKILL)


async def test_terminate_asks_first_and_a_program_that_answers_ends_by_itself(backend, read_place_file):
    """SIGHUP/SIGTERM first: a program that traps them says goodbye and exits 3, and terminate returns that
    exit without waiting out the grace period, so no SIGKILL was needed."""
    said = f"/tmp/tether-bye-{uuid.uuid4().hex[:8]}"
    script = f"trap 'echo bye-$((6*7)); echo bye > {said}; exit 3' HUP TERM; echo ready; while :; do sleep 0.1; done"
    tags = make_tags()
    process = await backend.spawn(shell(script), tags)
    output = await read_until(process, b"ready")

    async def pump() -> bytes:  # as an owner does; the last words are readable where the backend keeps them
        chunks = []
        while chunk := await process.read():
            chunks.append(chunk)
        return b"".join(chunks)

    reading = asyncio.ensure_future(pump())
    try:
        started = time.monotonic()
        exit = await asyncio.wait_for(process.terminate(grace=10), 30)
        assert time.monotonic() - started < 10, "terminate waited out the grace period"
        assert (exit.code, exit.signal) == (3, None)
        assert await asyncio.to_thread(read_place_file, said) == "bye\n"
        output += await asyncio.wait_for(reading, 10)
        if backend.name != "tmux":  # tmux's stream ends when terminate detaches, before the signals
            assert b"bye-42" in output
        assert left_behind(tags.marker) == []
    finally:
        reading.cancel()
        for survivor in left_behind(tags.marker):
            survivor.signal(signal.SIGKILL)
        if backend.name != "docker":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(said)


async def test_fifty_megabytes_arrive_intact(backend):
    data = f"/tmp/tether-50m-{uuid.uuid4().hex[:8]}"
    # -opost: no \n -> \r\n translation, so the bytes read are exactly the file's bytes.
    producer = await backend.spawn(
        shell(f"head -c 37500000 /dev/urandom | base64 > {data}", f"stty -opost -echo; cat {data}"), make_tags()
    )
    received = hashlib.sha256()
    total = 0

    async def pump():
        nonlocal total
        while chunk := await producer.read():
            assert len(chunk) <= 64 * 1024
            total += len(chunk)
            received.update(chunk)

    await asyncio.wait_for(pump(), 120)
    assert (await asyncio.wait_for(producer.wait(), 10)).code == 0
    assert total > 50_000_000
    check = await backend.spawn(shell(f"stty -opost -echo; sha256sum {data} | cut -c1-64; rm -f {data}"), make_tags())
    expected = (await drain(check)).strip().decode()
    assert received.hexdigest() == expected


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


# A stalled program's output may sit in bounded buffers only. The writer below makes about 20 MB/s when read
# (docker, measured), so 3.5 s of a buffer that grows would be ~70 MB: far over these limits.
OUR_GROWTH_LIMIT_KIB = 10 * 1024
RELAY_GROWTH_LIMIT_KIB = 16 * 1024  # dockerd is shared with other programs on the host: leave room for their noise


@pytest.mark.exclusive  # weighs dockerd, which every docker test uses
async def test_stalled_reader_makes_the_writer_block_with_flat_memory(backend, read_place_file, output_relays):
    counter = f"/tmp/tether-counter-{uuid.uuid4().hex[:8]}"
    line = "x" * 200
    # The writer records its progress after each write; a blocked write stops the count.
    script = f"n=0; while :; do n=$((n+1)); echo {line}; [ $((n % 100)) -eq 0 ] && echo $n > {counter}; done"
    process = await backend.spawn(shell(script), make_tags())
    try:
        await read_until(process, f"{line}\r\n{line}".encode())
        watched = {"this process": os.getpid(), **output_relays()}
        before = {name: rss_kib(pid) for name, pid in watched.items()}
        await asyncio.sleep(2)  # the reader stalls
        progress = read_place_file(counter)
        await asyncio.sleep(1.5)
        assert read_place_file(counter) == progress, "the writer kept going while nobody read"
        grown = {name: rss_kib(pid) - before[name] for name, pid in watched.items()}
        assert grown.pop("this process") < OUR_GROWTH_LIMIT_KIB
        assert {name: kib for name, kib in grown.items() if kib >= RELAY_GROWTH_LIMIT_KIB} == {}, grown
        # Reading again lets it go on.
        for _ in range(20):
            await process.read()
        await asyncio.sleep(0.3)
        await read_until(process, line.encode())
    finally:
        await process.terminate(grace=0.5)
        if backend.name != "docker":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(counter)


def holder_pids(marker: str) -> list[int]:
    """The session holders (their serving process) of the program carrying ``marker``, in any container too."""
    found = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            if entry.isdigit() and b"serve" in argv[1:2] and any(marker.encode() in arg for arg in argv):
                found.append(int(entry))
    return found


def cpu_seconds(pid: int) -> float:
    with contextlib.suppress(OSError):
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


async def test_a_kill_reaches_the_program_while_nobody_reads_its_output(backend, settings):
    """An owner whose viewers are behind stops reading; its Kill must still arrive. In a container the holder's
    relay once waited with everything in one buffer: sitting in a write of output nobody read, it passed no
    Kill on, and the program ran on ("the holder did not record the program's end")."""
    settings.TETHER_HOLDER_RING_BYTES = 8 * 1024 * 1024  # more held output than the pipes between can take
    tags = make_tags()
    process = await backend.spawn(shell(f"echo ready; while :; do echo {'y' * 500}; done"), tags)
    try:
        await read_until(process, b"ready")
        await asyncio.sleep(2)  # nobody reads: every pipe and buffer on the way fills
        exit = await asyncio.wait_for(process.terminate(grace=0.5), 15)
        assert exit is not None and (exit.signal or exit.code), exit
        assert left_behind(tags.marker) == []
        # The holder waits with a full ring for a reader, idle: it once spun a core on its hung-up terminal.
        holders = holder_pids(tags.marker)
        assert bool(holders) == (getattr(process.handle, "holder", None) is not None)
        before = sum(cpu_seconds(pid) for pid in holders)
        await asyncio.sleep(1)
        assert sum(cpu_seconds(pid) for pid in holders) - before < 0.1
    finally:
        with contextlib.suppress(Exception):
            await process.release()  # the link too (a relay left writing to nobody outlives the test)
        for survivor in left_behind(tags.marker):
            survivor.signal(signal.SIGKILL)


async def test_inspect_sees_a_live_process_and_its_exit(make_backend):
    first = make_backend()
    process = await first.spawn(shell("read line; exit 3"), make_tags())
    observer = make_backend()
    assert (await observer.inspect(process.handle)).status == Status.ALIVE
    await process.write(b"go\n")
    exit = await asyncio.wait_for(process.wait(), 10)
    assert exit.code == 3
    seen = await observer.inspect(process.handle)
    # A plain local PTY cannot read back an exit it did not reap itself; a holder, tmux and docker can.
    plain = first.name == "local" and process.handle.holder is None
    assert seen.status in ({Status.GONE} if plain else {Status.EXITED})
    if seen.status == Status.EXITED:
        assert seen.exit.code == 3

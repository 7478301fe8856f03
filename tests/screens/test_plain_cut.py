"""The worker cuts long plain runs short before they reach the emulator (terminals/screen/plain.py), where the
emulator has said its terminal lets them be, or what was sent since keeps it so. Fuzzed through the real emulator
process: random streams of plain runs (wide and combining characters, colour changes, tabs, backspaces, bare LFs,
lines longer than the screen) between control sequences (the alternate screen, regions, insert and origin mode,
C1 controls, a title, a charset), cut into chunks anywhere, go to two shells of one emulator, one cut short by the
worker and one sent every byte; their screens (both buffers, scrollback, cursor, pen, modes: the screen a page is
given) must be the same bytes."""

from __future__ import annotations

import asyncio
import random
import re

import pytest

from terminals.screen import Screens, ShellScreen, plain
from terminals.screen.frames import ERASED
from terminals.screen.plain import cut_short, plain_escapes, python_escapes, unfinished

SCROLLBACK = 30
WORDS = ["a", "bc", "def ", "中文", "e\u0301", "\t", "x\by", "0123456789", "\uff57\uff49\uff44\uff45", "😀",
         "\x1b[31m", "\x1b[0m", "\x1b[1;4:3;38;5;200m", "\x1b[m", "\x1b[48;2;1;2;3m", "\x1b[7;58:5:9m"]  # fmt: skip


SAVES = ("\x1b7", "\x1b8", "\x1b7[31m", "\x1b8[m")  # the cursor saved and restored (and by 1049)


def stream(rand: random.Random, cols: int, rows: int, saves: bool = True) -> bytes:
    def line() -> str:
        return "".join(rand.choice(WORDS) for _ in range(rand.randrange(12))) + rand.choice(["\r\n"] * 4 + ["\n"])

    controls = [
        "\x1b[31m", "\x1b[0m", "\x1b[1;44m", "\x1b[2J", "\x1b[K", "\x1b[r", "\x1b[?1049h", "\x1b[?1049l",
        "\x1b[4h", "\x1b[4l", "\x1b[?6h", "\x1b[?6l", "\x1b(0", "\x1b(B", "\x1b]2;title\x07", "\x1b7", "\x1b8",
        "\x9b2J", "\x7f", "\x1b[?25l", "\x1bM", "\x1b[3S", "\x1b7[31m", "\x1b8[m",
    ]  # fmt: skip
    if not saves:
        controls = [control.replace("1049", "1047") for control in controls if control not in SAVES]
    parts = []
    for _ in range(2 + rand.randrange(8)):
        if rand.random() < 0.6:
            run = rand.choice(["\x1b[1;35m", "\x1b[4:3;48;5;17m", "\x1b[0;7m"]) if rand.random() < 0.3 else ""
            if rand.random() < 0.5:  # back on the normal screen, no region, no insert or origin mode: cut-worthy
                run = ("\x1b[?1049l" if saves else "\x1b[?1047l") + "\x1b[r\x1b[4l\x1b[?6l" + run
            lines = rand.randrange(20) if rand.randrange(3) == 0 else 60 + rand.randrange(1500)
            parts.append(run + "".join(line() for _ in range(lines)))
        elif rand.random() < 0.2:
            parts.append(f"\x1b[{1 + rand.randrange(3)};{rows - rand.randrange(3)}r")
        elif rand.random() < 0.2:
            parts.append(f"\x1b[{1 + rand.randrange(rows)};{1 + rand.randrange(cols)}H")
        else:
            parts.append(rand.choice(controls))
    return "".join(parts).encode()  # (C1's CSI, U+009B, as UTF-8: ESC [ to xterm.js)


class EveryByte(ShellScreen):
    """The reference: every byte sent to the emulator."""

    def _write(self, data: bytes) -> None:
        self._frame(b"D", data)

    def acked(self, frames: int, plain: bool) -> None:
        pass


async def fuzz(seed: int, count: int, cols: int, rows: int) -> dict:
    screens = Screens(scrollback=SCROLLBACK)
    failures, cut, sent = [], 0, 0
    try:
        for case in range(seed, seed + count):
            rand = random.Random(case)
            data = stream(rand, cols, rows)
            shells = [
                ShellScreen(screens, 2 * case, cols, rows, fed=0),
                EveryByte(screens, 2 * case + 1, cols, rows, fed=0),
            ]
            for shell in shells:  # a shell's terminal is made before its output (the emulator's word on it comes back)
                shell.feed(0, b"$ ")
                shell.send()
            await screens.ask(shells[1], b"T")
            at = 2
            data = b"$ " + data
            while at < len(data):
                size = 1 + rand.randrange(64) if rand.random() < 0.3 else 4096 + rand.randrange(40_000)
                for shell in shells:
                    shell.feed(at, data[at : at + size])
                    shell.send()
                at += size
                if rand.random() < 0.6:  # the emulator catches up (its acknowledgements read) now and then
                    await screens.ask(shells[1], b"T")
            answers = [await screens.ask(shell) for shell in shells]
            assert answers[1] is not None and answers[1][0] == 0, answers[1]
            if answers[0] != answers[1]:
                failures.append(case)
            cut += shells[0].cut
            sent += len(data)
            for shell in shells:
                shell.close()
    finally:
        await screens.close()
    return {"failures": failures, "cut": cut, "sent": sent}


@pytest.mark.parametrize(("cols", "rows"), [(80, 24), (40, 8), (12, 4)])
async def test_a_run_cut_short_by_the_worker_leaves_the_screen_every_byte_leaves(cols, rows):
    found = await fuzz(1, 60, cols, rows)
    assert found["failures"] == [], found
    assert found["cut"] > 20_000, found  # the cut was made, not only written around


async def test_a_large_file_is_mostly_not_sent():
    """`cat` of 4 MB of coloured lines, as a pipe gives it, its screen left every 256 KiB: the emulator is sent
    every byte of the first batch only (until it says its terminal lets the cut be made), then only what is held
    when it is asked for the screen; it makes one screen left, the rest are made from it and what was held."""
    screens = Screens(scrollback=200)
    line = "".join(f"\x1b[3{n % 8}mword{n}\x1b[0m " for n in range(12)).encode() + b"\r\n"
    data = line * (4 * 1024 * 1024 // len(line))
    kept = []

    async def keep(offset: int, screen: bytes) -> None:
        kept.append(offset)

    shell = ShellScreen(screens, 1, 80, 24, fed=0, keep=keep, keep_every=256 * 1024)
    whole = EveryByte(screens, 2, 80, 24, fed=0)
    asked = 0
    ask = screens.ask

    async def counted(one, kind=b"S"):
        nonlocal asked
        asked += one is shell and kind == b"K"
        return await ask(one, kind)

    screens.ask = counted
    try:
        screens.start()
        await screens.render(80, 24, b"node started: ready")
        for at in range(0, len(data), 65536):
            for one in (shell, whole):
                one.feed(at, data[at : at + 65536])  # (sent in batches of a MiB)
            await asyncio.sleep(0.005)  # as a pipe gives it (the emulator's word comes back meanwhile)
            while shell.keeping is not None:  # (each screen left before more comes: as many, however loaded)
                await asyncio.sleep(0.005)
        shell.send()
        whole.send()
        answers = [await screens.ask(one) for one in (shell, whole)]
    finally:
        await screens.close()
    assert answers[0] == answers[1] and answers[0][0] == 0
    assert shell.cut > 0.97 * len(data), (shell.cut, len(data))  # (249 lines sent for each screen asked)
    assert len(kept) >= 15 and asked <= 2, (kept, asked)


async def test_the_fuzz_sees_a_cut_that_keeps_too_few_lines(monkeypatch):
    """The comparison is not blind: a cut that keeps a quarter of the lines it must loses scrollback, found where no
    later output scrolled it away (4 of these 60 streams)."""
    monkeypatch.setattr(
        "terminals.screen.frames.cut_short", lambda data, keep, escapes: plain.cut_short(data, keep // 4, escapes)
    )
    found = await fuzz(1, 60, 40, 8)
    assert len(found["failures"]) >= 3, found


def test_what_is_plain_and_what_is_not():
    assert plain_escapes(b"text \x1b[1;31mred\x1b[0m\tand\bback\r\n\xe4\xb8\xad") == 2
    assert plain_escapes(b"no colour at all") == 0
    # ESC 7 and ESC 8 (save and restore the cursor and pen) before a "[": found by a review
    assert plain_escapes(b"\x1b[32mgreen\x1b8[m") is None and plain_escapes(b"\x1b7[31m") is None
    assert plain_escapes(b"a colour cut at the end \x1b[38;5") == plain_escapes(b"or here \x1b") == 1
    for control in (b"\x1b[2J", b"\x1b]2;t\x07", b"\x1b7", b"\x07", b"\x7f", b"\xc2\x9b", b"\x1b[?1049h", b"\x00",
                    b"\x1b[>4;1m", b"\x1b[1 m", b"\x1b\x1b[m", b"\x1b[3\x1b[m"):  # fmt: skip
        assert plain_escapes(b"text \x1b[31m" + control + b" more") is None, control
    assert unfinished(b"abc\x1b[0m") == unfinished("中".encode()) == unfinished(b"") == 0
    assert unfinished(b"abc\x1b[3") == 3 and unfinished("中".encode()[:2]) == 2 and unfinished(b"\x1b") == 1
    assert unfinished(b"a\x80") == unfinished(b"\xe4\xb8\xad\x80") == -1  # not UTF-8: the emulator is asked
    # An endless colour change is not carried on (rescanned with each piece, it cost more each time: a review)
    assert unfinished(b"\x1b[" + b"1" * 300) == -1 and unfinished(b"\x1b[" + b"1" * 200) == 202
    lines = b"".join(b"line %d\r\n" % n for n in range(1000))
    short = cut_short(b"\x1b[32m" + lines, keep=10)
    assert short == b"\x1b[32mline 0\r\n\r" + b"".join(b"line %d\r\n" % n for n in range(990, 1000))
    assert cut_short(lines[:4000], keep=10) is None  # too short to be worth it


def test_the_scan_in_c_says_what_pythons_says():
    """plain.c (built by `make holder`, loaded by the worker) against plain.py's own scan, on random strings of the
    bytes where they could part: escapes and what may follow them, parameters, C1 controls as UTF-8, cut anywhere."""
    assert plain.NATIVE is not None, f"{plain.LIBRARY} is not built (make holder)"
    tokens = [b"a", b"[", b"m", b"0", b"1;2", b":", b"\x1b", b"\x1b[", b"\x1b[31m", b"\x1b[m", b"\x1b7", b"\xc2",
              b"\x80", b"\x9b", b"\xc2\x9b", b"\xe4\xb8\xad", b"\r\n", b"\t", b"\b", b"\x00", b"\x07", b"\x7f", b"?",
              b"h", b" "]  # fmt: skip
    rand = random.Random(7)
    seen = {None: 0, "escapes": 0}
    for _ in range(20_000):
        data = b"".join(rand.choice(tokens) for _ in range(rand.randrange(12)))
        if rand.random() < 0.1:
            data = bytes(rand.randrange(256) for _ in range(rand.randrange(8)))
        expected = python_escapes(data)
        assert plain_escapes(data) == expected, data
        seen[None if expected is None else "escapes"] += 1
    assert min(seen.values()) > 2000, seen  # both answers drawn often


async def test_output_short_of_a_batch_is_sent_within_a_second():
    """The worker gathers output in pieces of a MiB for the emulator; what an idle shell printed last does not
    wait whole in the worker's memory for more: within SEND_WITHIN it is sent, or held cut short (plain output,
    sent when the screen is asked for)."""
    from terminals.screen.shell import SEND_WITHIN

    screens = Screens(scrollback=SCROLLBACK)
    shell = ShellScreen(screens, 1, 80, 24, fed=0)
    try:
        shell.feed(0, b"$ ls\r\nfile-a  file-b\r\n$ ")
        assert shell.pending
        await asyncio.sleep(SEND_WITHIN + 0.5)
        assert not shell.pending
        assert "file-a  file-b" in (await screens.ask(shell, b"T")).decode()
    finally:
        shell.close()
        await screens.close()


async def kept_and_restored(seeds: range, cols: int, rows: int) -> dict:
    """Shells whose screen is left every 64 KiB (with the session holder, as a worker does): each screen left,
    given to a new shell with the output after it, must leave the screen (without scrollback: what is left) of a
    shell sent every byte. Counts the screens made without asking the emulator (its last one and what was held).

    The streams save no cursor: xterm.js keeps a saved cursor's row as a line of its whole buffer, so where a
    restore puts it after later output scrolled depends on how full the scrollback is, and a screen left with the
    session holder has none (a restored terminal's saved cursor moves up with scrolling where the first's, its
    scrollback full, stayed: the same for a screen the emulator made)."""
    screens = Screens(scrollback=SCROLLBACK)
    failures, kept_count, asked = [], 0, 0
    ask = screens.ask

    async def counted(shell, kind=b"S"):
        nonlocal asked
        asked += kind == b"K" and shell.keep is not None
        return await ask(shell, kind)

    screens.ask = counted
    try:
        for case in seeds:
            rand = random.Random(case)
            line = "".join(f"\x1b[3{n % 8}mword{n}\x1b[0m " for n in range(rand.randrange(1, 14))).encode() + b"\r\n"
            runs = [line * rand.randrange(50, 4000) + stream(rand, cols, rows, saves=False) for _ in range(6)]
            data = b"$ " + b"".join(runs)
            kept: list[tuple[int, bytes]] = []

            async def keep(offset: int, screen: bytes, kept=kept) -> None:
                kept.append((offset, screen))

            shell = ShellScreen(screens, 10_000 + 3 * case, cols, rows, fed=0, keep=keep, keep_every=64 * 1024)
            whole = EveryByte(screens, 10_001 + 3 * case, cols, rows, fed=0)
            at = 0
            while at < len(data):
                size = 1 + rand.randrange(64) if rand.random() < 0.2 else 4096 + rand.randrange(40_000)
                for one in (shell, whole):
                    one.feed(at, data[at : at + size])
                at += size
                await asyncio.sleep(0.002 if rand.random() < 0.7 else 0.02)
            whole.send()
            truth = await screens.ask(whole, b"K")
            while shell.keeping is not None:
                await asyncio.sleep(0.01)
            shell.close()
            whole.close()
            assert kept, case
            # Each screen left against the screen at its offset (then, given the rest, against the last screen).
            then = EveryByte(screens, 10_002 + 3 * case, cols, rows, fed=0)
            for number, (offset, screen) in enumerate(kept):
                then.feed(then.fed, data[then.fed : offset])
                then.send()
                restored = screens.shell(cols, rows, origin=offset, restore=screen)
                assert restored._open()
                if await screens.ask(restored, b"K") != await screens.ask(then, b"K"):
                    failures.append((case, number, offset, "at its offset"))
                restored.feed(offset, data[offset:])
                restored.send()
                if await screens.ask(restored, b"K") != truth:
                    failures.append((case, number, offset, "after the rest"))
                restored.close()
            then.close()
            kept_count += len(kept)
    finally:
        await screens.close()
    return {"failures": failures, "kept": kept_count, "asked": asked}


async def test_a_screen_left_from_what_was_held_is_the_screen():
    """While plain output is held back from the emulator, the screen left for a later owner is the emulator's last
    and what was held after it: a new owner given it, then the rest of the output, has the screen of one sent
    every byte, at that offset and after the rest (fuzzed: coloured runs between control sequences, chunks of any
    size; a fifth at least made so, the rest after a sequence that is not plain)."""
    found = await kept_and_restored(range(1, 9), 80, 24)
    assert found["failures"] == [], found
    assert found["kept"] - found["asked"] > found["kept"] // 5 > 0, found


async def test_the_held_screen_fuzz_sees_a_cut_that_keeps_too_few_lines(monkeypatch):
    """Not blind: a screen left from fewer held lines than the screen has rows is found."""
    monkeypatch.setattr(
        "terminals.screen.frames.cut_short",
        lambda data, keep, escapes=1, **more: plain.cut_short(data, keep // 4, escapes, **more),
    )
    found = await kept_and_restored(range(1, 5), 80, 24)
    assert found["failures"], found


async def test_a_screen_left_from_what_was_held_has_no_made_up_scrollback():
    """A screen left from the emulator's last and the held run's last lines: a later owner's terminal shows the
    run's last lines in its scrollback, consecutive, and not what the cut left out run together with them (a review
    found the screen the emulator last made and the run's first line directly above its last lines)."""
    screens = Screens(scrollback=200)
    kept = []

    async def keep(offset: int, screen: bytes) -> None:
        kept.append((offset, screen))

    shell = ShellScreen(screens, 1, 80, 24, fed=0, keep=keep, keep_every=64 * 1024)
    data = b"$ " + b"".join(b"line %d of the run\r\n" % n for n in range(1, 40_001))
    try:
        screens.start()
        await screens.render(80, 24, b"node started: ready")
        for at in range(0, len(data), 16384):
            shell.feed(at, data[at : at + 16384])
            await asyncio.sleep(0.002)
            while shell.keeping is not None:  # (each screen left before more comes)
                await asyncio.sleep(0.005)
        while shell.keeping is not None:
            await asyncio.sleep(0.01)
        built = [(offset, screen) for offset, screen in kept if ERASED in screen]  # (left from what was held)
        assert built, [offset for offset, _ in kept]
        offset, screen = built[-1]
        restored = screens.shell(80, 24, origin=offset, restore=screen)
        assert restored._open()
        answer = await screens.ask(restored)  # the screen a page back past the buffer is given, scrollback and all
    finally:
        await screens.close()
    numbers = [int(n) for n in re.findall(rb"line (\d+) of the run", answer)]
    last = int(re.findall(rb"line (\d+) of the run", data[:offset])[-1])  # the last line at its offset
    assert numbers == list(range(numbers[0], last + 1)) and len(numbers) >= 24, (numbers, last)

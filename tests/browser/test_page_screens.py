"""The page itself, with the worker keeping local shells' screens: a reload past the buffer draws the screen the
worker kept, then the kept bytes, and says what happened in a line that stays."""

from __future__ import annotations

import asyncio
import re

import pytest
from playwright.async_api import expect

from tests.browser.test_terminal_page import log_in, open_workspace, run, screen_text, wait_for_text, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.django_db, pytest.mark.asyncio(loop_scope="module")]

# Screens on (the default, said); and a page away for more than 2 s no longer holds the
# shell's output back.
STACK_ENV = {"TETHER_SCREEN_SCROLLBACK": "200", "TETHER_RECONNECT_GRACE_SECONDS": "2"}


async def test_a_reload_past_the_buffer_draws_the_screen_the_worker_kept_and_says_so(page, host_machine):
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    gap = page.locator("#terminal-gap")
    # ~1.1 MB through a 256 KiB buffer, then a full-screen program's frame in the alternate screen.
    await run(page, "yes $(printf '%0100d' 0) | head -n 11000; echo done-$((4*4))")
    await wait_for_text(page, r"^done-16$")
    await run(page, r"printf '\033[?1049h\033[H\033[2J\033[7m header of the program \033[0m\r\nbody\r\n'; sleep 30")
    await wait_for_text(page, r"header of the program")
    await page.reload()
    await wait_live(page)
    # The alternate screen as the program left it (a torn tail would show the normal screen's last lines).
    await wait_for_text(page, r"header of the program")
    text = await screen_text(page)
    assert "done-16" not in text.split("header of the program")[-1]
    await expect(gap).to_be_visible()
    said = await page.locator("#terminal-gap-text").text_content()
    assert re.fullmatch(r"Reconnected: the screen is as it is now; \d+ KB of earlier output are not kept", said)
    await page.keyboard.press("Control+C")  # the program ends; leaving the alternate screen shows what was before
    await run(page, r"printf '\033[?1049l'")
    await wait_for_text(page, r"^done-16$")
    # The line saying what was not kept is in the scrollback above the screen (the screen's reset wiped it).
    assert "bytes of output were not kept; below is the screen as it is now" in await normal_buffer(page)


FRAME = r"""
import os, sys, time
cols, rows = os.get_terminal_size()
lines = [("r%02d" % y).ljust(cols - 1, "-") + "E" for y in range(1, rows + 1)]  # rows the width of the screen
out = sys.stdout.buffer
out.write(b"\033[?1049h")
for n in range(1_100_000 // (cols * rows) + 1):  # past the buffer, the same frame drawn again and again
    out.write(b"".join(b"\033[%d;1H%s" % (y + 1, line.encode()) for y, line in enumerate(lines)))
out.write(b"\033[1;1H" + ("r01".ljust(cols - 1, "=") + "E").encode())  # the last bytes: the page waits for them
out.flush()
time.sleep(600)  # (a resize changes nothing: SIGWINCH is ignored, so only what it drew is on the screen)
"""


async def test_a_page_of_another_width_draws_the_screen_at_the_grid_it_was_kept_then_its_own(
    page, host_machine, tmp_path
):
    """A new page narrower than the one that watched: the screen (kept for the old grid) and the bytes after it
    (drawn for it too) are drawn at that grid, then the page takes its own, as a terminal that saw every byte and
    was then resized (an alternate screen is cut, not wrapped). Drawn at the page's own grid from the start, each
    row of the frame (as wide as the old grid) wraps, and the last scrolls the first away."""
    await log_in(page, "operator", "operator-password")
    await open_workspace(page, host_machine)
    before = await page.evaluate("window.tetherTerminal.state()")
    script = tmp_path / "frame.py"
    script.write_text(FRAME)
    await run(page, f"python3 {script}")
    # Every byte through before the page goes (bytes the worker reads after the new page's grid are its own).
    await wait_for_text(page, r"^r01=+E$")
    await page.set_viewport_size({"width": 860, "height": 680})
    await page.reload()
    await wait_live(page)
    grid = await page.evaluate("window.tetherTerminal.state()")
    assert grid["cols"] < before["cols"] and grid["rows"] == before["rows"], (before, grid)
    await expect(page.locator("#terminal-gap")).to_be_visible()  # past the buffer: the screen kept was drawn
    wanted = [  # (the first row last drawn with "=")
        (f"r{y:02d}".ljust(before["cols"] - 1, "=-"[y > 1]) + "E")[: grid["cols"]] for y in range(1, grid["rows"] + 1)
    ]
    shown = await page.evaluate(
        "(() => { const t = window.tetherTerminal.term, b = t.buffer.active, rows = [];"
        " for (let y = 0; y < t.rows; y++) rows.push(b.getLine(b.baseY + y).translateToString(true, 0, t.cols));"
        " return rows; })()"
    )
    assert shown == wanted
    await page.keyboard.press("Control+C")


async def normal_buffer(page) -> str:
    """The page's normal buffer, scrollback and screen, as text."""
    return await page.evaluate(
        "(() => { const b = window.tetherTerminal.term.buffer.normal; const rows = [];"
        " for (let y = 0; y < b.length; y++) rows.push(b.getLine(y).translateToString(true));"
        " return rows.join('\\n'); })()"
    )


class Cuttable:
    """A TCP proxy to daphne that can be cut, as a network outage is: every connection through it ends at once and
    new ones are closed as they come, until it is mended (Chromium's offline mode leaves open WebSockets alone)."""

    def __init__(self, target: int):
        self.target = target
        self.up = True
        self.links: set = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _client(self, reader, writer) -> None:
        if not self.up:
            writer.transport.abort()
            return
        try:
            upstream_reader, upstream = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        link = (writer, upstream)
        self.links.add(link)

        async def pipe(source, sink) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except OSError:
                pass
            finally:
                sink.transport.abort()

        await asyncio.gather(pipe(reader, upstream), pipe(upstream_reader, writer))
        self.links.discard(link)

    def cut(self) -> None:
        self.up = False
        for ends in list(self.links):
            for end in ends:
                end.transport.abort()

    def mend(self) -> None:
        self.up = True

    async def close(self) -> None:
        self.cut()
        self.server.close()
        await self.server.wait_closed()


async def test_an_outage_past_the_grace_draws_the_screen_as_it_is_now_and_says_so(page, host_machine, stack):
    """The network goes for longer than the grace (2 s here) while the program prints past the buffer, draws a
    frame in the alternate screen and more under it: back, the page shows the frame as it is now (a tail would miss
    what was drawn before it) and says what was not kept, and leaving the alternate screen shows the lines printed
    before it; what the page had seen before the outage stays in its scrollback, above a line saying what was not
    kept (the screen's full reset wiped it)."""
    proxy = Cuttable(stack.ports[0])
    url = await proxy.start()
    context = await page.context.browser.new_context(base_url=url, viewport={"width": 1100, "height": 680})
    try:
        away = await context.new_page()
        await log_in(away, "operator", "operator-password")
        await open_workspace(away, host_machine)
        await run(away, "echo seen-before-$((6*7))")
        await wait_for_text(away, r"^seen-before-42$")
        # 1.1 MB of lines, then a frame drawn once in the alternate screen and 300 KB more drawn under it (more
        # than the 256 KiB the worker keeps): a tail alone has neither the frame nor the normal screen.
        await run(
            away,
            "sleep 3; yes $(printf '%0100d' 0) | head -n 11000; echo printed-$((5*5)); "
            r"printf '\033[?1049h\033[H\033[2J\033[7m frame of the program \033[0m'; "
            r"for i in $(seq 6000); do printf '\033[%d;1H body line %d, drawn under the frame\033[K' $((i%22+2)) $i; "
            "done; "
            "sleep 60",
        )
        proxy.cut()
        await expect(away.locator("#terminal-status")).not_to_have_text("Connected")
        await asyncio.sleep(12)  # the 3 s before the output, the grace, the output and some more
        # A key in the outage (dropped): xterm then writes the next output at once, not on a timer, so the page's
        # own lines must be read before the screen's reset is written (a full run found the line saying what was
        # not kept over the line seen before the outage: the page's last row read after the reset).
        await away.keyboard.press("x")
        proxy.mend()
        await expect(away.locator("#terminal-status")).to_have_text("Connected", timeout=30_000)
        await wait_for_text(away, r"body line 6000, drawn under the frame")
        assert "frame of the program" in await screen_text(away)
        said = await away.locator("#terminal-gap-text").text_content()
        assert re.fullmatch(r"Reconnected: the screen is as it is now; \d+ KB of earlier output are not kept", said)
        assert "printed-25" not in await screen_text(away)  # the alternate screen, not the tail of the output
        await away.keyboard.press("Control+C")
        await run(away, r"printf '\033[?1049l'")
        await wait_for_text(away, r"^printed-25$")  # the normal screen as the output left it
        assert re.search(r"^0{100}$", await screen_text(away), re.M)
        # What the page had seen is still in its scrollback (the screen begins with a full reset, which wiped it),
        # once, then the line that says what was not kept, then the screen as it was.
        seen = await normal_buffer(away)
        assert seen.count("seen-before-42") == 1, seen[-3000:]
        marker = seen.index("bytes of output were not kept; below is the screen as it is now")
        assert seen.index("seen-before-42") < marker < seen.rindex("printed-25")
        # No blank rows between what was seen and that line (the page's rows under its last line are not kept).
        assert not re.search(r"seen-before-42\n(.*\n)*\n\n\[\.\.\. \d+ bytes of output were not kept", seen)
    finally:
        await context.close()
        await proxy.close()

"""The mark reader on a real bash's output: the same marks however the stream is cut into reads; a mark a
program prints (no nonce, a wrong one, one left open) neither opens, closes nor swallows a record's."""

from __future__ import annotations

import asyncio
import os
import pty
import select
import time

import pytest

from terminals import marks
from terminals.backends.base import SpawnSpec
from terminals.marks import MarkReader, new_nonce, plan, shell_of, unescape, visible


async def _plan(spec: SpawnSpec, nonce: str | None = None, machine_tracks: bool = True):
    if nonce is not None:
        marks.new_nonce = lambda: nonce  # the session's, to read its marks with
    try:
        return await plan(spec, machine_tracks=machine_tracks, place=_on_this_host)
    finally:
        marks.new_nonce = new_nonce


async def _on_this_host(path) -> str:
    return str(path)


def _bash_session(nonce: str, lines: list[bytes]) -> bytes:
    """What a real interactive bash with the integration prints while ``lines`` are typed into it."""
    spec, given, note = asyncio.run(_plan(SpawnSpec(argv=("/bin/bash", "--noprofile", "--norc")), nonce))
    assert given == nonce and not note
    return _run_bash(spec, lines)


def _run_bash(spec: SpawnSpec, lines: list[bytes]) -> bytes:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TERM": "xterm-256color", "LANG": "C.UTF-8", **spec.env}
    pid, fd = pty.fork()
    if pid == 0:  # the child: the shell
        os.execve(spec.argv[0], list(spec.argv), env)
    output = bytearray()

    def read_for(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 0.02)[0]:
                try:
                    output.extend(os.read(fd, 65536))
                except OSError:
                    return

    read_for(0.5)
    for line in lines:
        os.write(fd, line)
        read_for(0.3)
    os.close(fd)
    os.waitpid(pid, 0)
    return bytes(output)


@pytest.fixture(scope="module")
def recorded():
    nonce = new_nonce()
    typed = [
        b"echo one\r",
        b"false\r",
        "echo 'naïve;\\ back'\r".encode(),  # ';' and '\\' are escaped in the mark, UTF-8 kept
        # A program's marks: none with this shell's nonce, one left open before the shell's own end mark.
        b"printf '\\033]133;C;cmdline=evil;tether=0000\\007\\033]133;D;0\\007\\033]133;A;tether='\r",
        b"(exit 7)\r",
    ]
    return nonce, _bash_session(nonce, typed)


def _marks(reader: MarkReader, chunks) -> list[tuple]:
    found, offset = [], 0
    for chunk in chunks:
        found += [(m.kind, m.start, m.end, m.status, m.command_line) for m in reader.feed(offset, chunk)]
        offset += len(chunk)
    return found


def test_marks_are_the_same_however_the_stream_is_cut(recorded):
    nonce, stream = recorded
    whole = _marks(MarkReader(nonce), [stream])
    commands = [line for kind, _, _, _, line in whole if kind == "C"]
    assert commands == [
        "echo one",
        "false",
        "echo 'naïve;\\ back'",
        "printf '\\033]133;C;cmdline=evil;tether=0000\\007\\033]133;D;0\\007\\033]133;A;tether='",
        "(exit 7)",
    ]
    statuses = [status for kind, _, _, status, _ in whole if kind == "D"]
    assert statuses == [0, 1, 0, 0, 7]  # the forged D;0 is not among them (the printf's own 0 is)
    # Every cut into two reads, and one byte at a time: the same marks at the same offsets.
    for cut in range(1, len(stream)):
        assert _marks(MarkReader(nonce), [stream[:cut], stream[cut:]]) == whole, cut
    assert _marks(MarkReader(nonce), [stream[i : i + 1] for i in range(len(stream))]) == whole


def test_foreign_marks_are_counted_and_ignored(recorded):
    nonce, stream = recorded
    reader = MarkReader(nonce)
    _marks(reader, [stream])
    assert reader.foreign == 3  # the printf's three marks, the last cut short by the shell's own next one
    # With another nonce, none of the shell's marks are this session's.
    assert _marks(MarkReader(new_nonce()), [stream]) == []


def test_a_command_mark_carries_what_the_screen_showed():
    nonce = "n"
    reader = MarkReader(nonce)
    data = b"\x1b]133;A;tether=n\x07\x1b[1;32muser@host\x1b[0m$ echo hx\x08i\r\n\x1b]133;C;cmdline=echo hi;tether=n\x07"
    prompt, command = reader.feed(0, data)
    assert prompt.kind == "A"
    assert command.typed == "user@host$ echo hi\n" and command.command_line == "echo hi"


def test_unescape_and_visible():
    assert unescape(r"a\x3bb\\c\x0ad") == "a;b\\c\nd"
    assert unescape("caf\\xc3\\xa9") == "café"
    assert visible(b"\x1b]0;title\x07ab\x08c\x1b[K") == "ac"


def test_only_interactive_bash_and_posix_shells_are_integrated(settings):
    shells = (("/bin/bash", "-l"), ("/usr/bin/zsh",), ("/bin/sh",), ("ash", "-i"))
    assert [shell_of(SpawnSpec(argv=argv)) for argv in shells] == ["bash", "zsh", "sh", "sh"]
    for argv in (("/bin/bash", "-c", "make"), ("/usr/bin/fish",), ("/bin/sh", "script.sh"), ("python3",)):
        spec = SpawnSpec(argv=argv)
        assert shell_of(spec) == ""
        assert asyncio.run(_plan(spec)) == (
            spec,
            "",
            f"{' '.join(argv)} is not a shell Tether integrates with (bash, zsh, sh)",
        )
    spec, nonce, _ = asyncio.run(_plan(SpawnSpec(argv=("/bin/sh",), env={"ENV": "/home/me/.shrc"})))
    assert spec.env["ENV"].endswith("terminals/shell/tether.sh") and spec.env["TETHER_ENV_WAS"] == "/home/me/.shrc"
    assert spec.env["TETHER_MARKS"] == nonce
    spec, _, _ = asyncio.run(_plan(SpawnSpec(argv=("/usr/bin/zsh", "-l"), env={"ZDOTDIR": "/home/me/.config/zsh"})))
    assert spec.env["ZDOTDIR"].endswith("terminals/shell/zsh") and spec.env["TETHER_ZDOTDIR"] == "/home/me/.config/zsh"
    assert asyncio.run(_plan(SpawnSpec(argv=("/bin/sh",)), machine_tracks=False))[1:] == (
        "",
        "shell integration is off for this machine",
    )
    settings.TETHER_TRACK_COMMANDS = False
    _, given, note = asyncio.run(_plan(SpawnSpec(argv=("/bin/bash",))))
    assert given == "" and "TETHER_TRACK_COMMANDS" in note


def test_a_malformed_mark_is_no_crash_and_no_record():
    reader = MarkReader("n")
    marks = reader.feed(
        0,
        "\x1b]133;D;\u00b2;tether=n\x07\x1b]133;D;0;tether=\u00e9\x07\x1b]133;D;99999999999;tether=n\x07".encode()
        + b"\x1b]133;C;tether=\xff\xfe\x07\x1b]133;D;0;tether=n\x07",
    )
    assert [(m.kind, m.status) for m in marks] == [("D", None), ("D", None), ("D", 0)]
    assert reader.foreign == 2


def test_the_users_own_prompt_commands_still_run_after_the_hook(tmp_path):
    """A PROMPT_COMMAND of the user's (here from the spec's environment) runs after Tether's, with no
    syntax error left by taking the hook out, and the statuses are still the commands' own."""
    nonce = new_nonce()
    log = tmp_path / "theirs"
    spec = SpawnSpec(argv=("/bin/bash", "--noprofile", "--norc"), env={"PROMPT_COMMAND": f"echo ran >> {log}"})
    spec, _, _ = asyncio.run(_plan(spec, nonce))
    assert spec.env["PROMPT_COMMAND"] == f'eval "$TETHER_BASH"; echo ran >> {log}'
    out = _run_bash(spec, [b"false\r", b"echo $PROMPT_COMMAND\r"])
    assert b"syntax error" not in out
    assert f"__tether_precmd; echo ran >> {log}; __tether_hist=${{HISTCMD-0}}".encode() in out
    statuses = [m.status for m in MarkReader(nonce).feed(0, out) if m.kind == "D"]
    assert statuses[:2] == [1, 0] and log.read_text().count("ran") >= 3

"""terminal_demo: every phase proves what it claims, on tmux and on docker (exit status 0 only if all held)."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from executions.models import Machine, MachineState
from tests.bridge.harness import Stack, database_url, without_marks

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]


def demo_env(data_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "TETHER_DATA_DIR": str(data_dir),
        "TETHER_LEASE_TTL_SECONDS": "4",
        "TETHER_HEARTBEAT_SECONDS": "1",
        # Names and labels scripts/clean-test-leftovers.sh removes if a run is interrupted.
        "TETHER_DEMO_PREFIX": "tether-test-demo",
        "TETHER_DEMO_LABEL": "tether.test=1",
        "TETHER_SHELL": "/bin/bash,--noprofile,--norc",  # as the tests' own shells (see conftest)
    }


def demo(
    phase: str, data_dir: Path, *extra: str, stdin: str | None = None, status: int = 0, env: dict | None = None
) -> str:
    env = {**demo_env(data_dir), **(env or {})}
    done = subprocess.run(
        [sys.executable, "manage.py", "terminal_demo", phase, *extra],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == status, f"{phase} exited {done.returncode}:\n{done.stdout}\n{done.stderr[-3000:]}"
    if status == 0:
        assert "NOT PROVEN" not in done.stdout
    return done.stdout + done.stderr


def test_demo_on_tmux_run_then_interrupt_and_recover_by_adoption(tmp_path):
    out = demo("run", tmp_path, "--backend", "tmux")
    assert "proven: the exit is known: completed with exit code 7" in out
    assert "proven: a separate command read the file back" in out
    assert "proven: the machine is marked deleted" in out

    demo("interrupt", tmp_path, "--backend", "tmux")
    out = demo("recover", tmp_path)
    assert "proven: the shell was adopted" in out
    assert "proven: the shell was launched exactly once (launch counter: 1)" in out
    demo("delete", tmp_path)
    assert not Machine.objects.exclude(state=MachineState.DELETED).filter(name__startswith="tether-test-demo").exists()


def test_demo_on_docker_interrupt_then_the_held_shell_is_adopted(tmp_path):
    demo("interrupt", tmp_path, "--backend", "docker")
    out = demo("recover", tmp_path)
    assert "proven: the shell was adopted" in out
    assert "proven: a viewer reattached to the same shell and typed into it" in out
    assert "proven: the shell was launched exactly once (launch counter: 1)" in out
    out = demo("delete", tmp_path)
    assert "no longer exists" in out


def test_demo_on_docker_without_the_holder_interrupt_then_unknown_is_resolved(tmp_path):
    plain = {"TETHER_HOLDER": "0"}  # a container where the holder cannot run: the shell dies with its worker
    demo("interrupt", tmp_path, "--backend", "docker", env=plain)
    out = demo("recover", tmp_path, env=plain)
    assert "proven: nothing could observe it: the outcome is unknown" in out
    assert "proven: the slot stays held until an operator resolves it" in out
    assert "proven: resolved after Tether's own checks" in out
    assert "proven: the shell was launched exactly once (launch counter: 1)" in out
    out = demo("delete", tmp_path, env=plain)
    assert "no longer exists" in out


def shell_session(data_dir: Path, *lines: str, backend: str = "tmux", env: dict | None = None) -> str:
    """The shell phase fed ``lines`` as a slow typist would (the first once the shell is up)."""
    shell = subprocess.Popen(
        [sys.executable, "manage.py", "terminal_demo", "shell", "--backend", backend],
        cwd=ROOT, env={**demo_env(data_dir), **(env or {})}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        time.sleep(4)  # Django, the in-process worker and the shell come up
        for line in lines:
            shell.stdin.write(line + "\n")
            shell.stdin.flush()
            time.sleep(1)
        out, _ = shell.communicate(timeout=60)
    finally:
        shell.kill()
    assert shell.returncode == 0, out
    return out


def test_every_state_the_shell_phase_leaves_has_a_next_phase_that_works(tmp_path):
    """After :close the tmux shell lives on with no owner: shell again adopts that same shell, recover adopts
    it and sees it exit, and delete ends whatever is still open before deleting the machine."""
    first = shell_session(tmp_path, "echo pid-$$-shell", ":close")
    pid = re.search(r"pid-(\d+)-shell", first).group(1)
    again = shell_session(tmp_path, "echo pid-$$-again", ":close")
    assert f"pid-{pid}-again" in again  # the same shell, adopted by the new worker
    recovered = demo("recover", tmp_path)
    assert "proven: the shell was adopted" in recovered
    assert "proven: its exit was observed by the new owner" in recovered
    assert "nothing to recover" in demo("recover", tmp_path)

    shell_session(tmp_path, ":close")
    deleted = demo("delete", tmp_path)
    assert "proven: nothing holds the machine's slot any more" in deleted
    assert "proven: the machine is marked deleted" in deleted and "no longer runs" in deleted


def test_interrupt_proves_which_worker_it_killed_and_refuses_when_another_holds_the_shell(tmp_path):
    stack = Stack()
    stack.extra_env.update(demo_env(tmp_path) | {"TETHER_LEASE_TTL_SECONDS": "4"})
    try:
        other = stack.start_worker("tmux")  # ready and polling: it claims the demo's shell first
        out = demo("interrupt", tmp_path, "--backend", "tmux", status=1)
        assert "NOT PROVEN: worker pid" in out and f"held by worker pid {other.pid}" in out, out
        assert "was killed with SIGKILL" not in out
    finally:
        stack.stop()
        socket = json.loads((tmp_path / "terminal-demo.json").read_text())["machine"]
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


class Terminal:
    """The far end of a PTY, as a person's terminal emulator: it sees what the program prints, types keys."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.master, slave = os.openpty()
        self.process = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=slave, stdout=slave, stderr=slave)
        os.close(slave)
        self.screen = b""

    def read_until(self, needle: bytes | re.Pattern, timeout: float = 30.0) -> bytes:
        deadline = time.monotonic() + timeout
        while not (needle.search(self.screen) if isinstance(needle, re.Pattern) else needle in self.screen):
            ready, _, _ = select.select([self.master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise AssertionError(f"{needle!r} never appeared: {self.screen[-600:]!r}")
            try:
                self.screen += os.read(self.master, 65536)
            except OSError:  # the program ended and its side of the PTY closed
                raise AssertionError(f"{needle!r} never appeared: {self.screen[-600:]!r}") from None
        return self.screen

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)


def real_terminal_shell(data_dir: Path, backend: str) -> Terminal:
    terminal = Terminal(
        [sys.executable, "manage.py", "terminal_demo", "shell", "--backend", backend], demo_env(data_dir)
    )
    terminal.read_until(b"shell: type as in any terminal")
    return terminal


def close_real_terminal_shell(terminal: Terminal, data_dir: Path) -> None:
    terminal.type(b":close\r")
    terminal.read_until(b"[detached;")
    assert terminal.process.wait(timeout=30) == 0


def test_demo_shell_on_docker_echoes_once_and_hands_the_terminals_answer_to_the_shell_that_asked(tmp_path):
    terminal = real_terminal_shell(tmp_path, "docker")
    try:
        # busybox ash asks where the cursor is after each prompt; the terminal answers, and here the answer
        # comes glued to the next line typed, as a fast typist (or a paste) makes it. The answer is the
        # shell's, whole; the demo's own command after it is still recognised as one.
        terminal.read_until(re.compile(rb"# (\x1b\]133;B;[^\x07]*\x07)?\x1b\[6n"))  # the prompt's end mark between
        terminal.type(b"\x1b[1;3R:resize 100 30\r")
        # A person's next line comes later (busybox ash itself drops input that arrives with its cursor
        # report and a resize at once, under plain `docker exec -it` too).
        time.sleep(0.5)
        terminal.type(b"stty size\r")
        terminal.read_until(b"30 100")
        terminal.type(b"echo once-$((2*3))\r")
        screen = without_marks(terminal.read_until(b"once-6\r\n"))
        assert screen.count(b"echo once-$((2*3))") == 1  # the remote shell's echo only
        assert b":resize" not in screen.split(b"stty size")[-1]  # never typed into the shell
        close_real_terminal_shell(terminal, tmp_path)
    finally:
        terminal.process.kill()
        os.close(terminal.master)
        subprocess.run(["docker", "rm", "-f", json.loads((tmp_path / "terminal-demo.json").read_text())["machine"]])


def test_demo_shell_on_tmux_echoes_once_and_leaves_queries_to_tmux_which_answered_them(tmp_path):
    terminal = real_terminal_shell(tmp_path, "tmux")
    try:
        terminal.read_until(re.compile(rb"bash-[\d.]+[#$] "))  # the prompt of bash --norc
        terminal.type(b"echo once-$((2*3))\r")
        # The remote shell's echo only (its command mark names the line too, invisibly: docs/commands.md).
        screen = without_marks(terminal.read_until(b"once-6\r\n"))
        assert screen.count(b"echo once-$((2*3))") == 1
        # tmux is the pane's terminal and answers the program's query itself; ours must not answer again.
        terminal.type(b"printf '\\033[6n'; read -rs -d R answer; echo answered-${#answer}\r")
        screen = terminal.read_until(re.compile(rb"answered-[1-9]"))
        assert b"\x1b[6n" not in screen
        terminal.type(b":resize 100 30\r")
        terminal.type(b"stty size\r")
        terminal.read_until(b"30 100")
        close_real_terminal_shell(terminal, tmp_path)
    finally:
        terminal.process.kill()
        os.close(terminal.master)
        socket = json.loads((tmp_path / "terminal-demo.json").read_text())["machine"]
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


def test_demo_shell_is_a_line_console_with_resize_interrupt_and_close(tmp_path):
    out = shell_session(tmp_path, "echo hi-$((1+1))", ":resize 90 20", "stty size", ":interrupt", ":close")
    assert "hi-2" in out and "20 90" in out  # typed lines ran; the resize reached the terminal
    assert "^C" in out  # :interrupt sent Ctrl-C
    assert "[detached;" in out
    # The detached shell stays in tmux for a next worker; this test has none: remove it.
    socket = json.loads((tmp_path / "terminal-demo.json").read_text())["machine"]
    subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


def test_demo_close_says_what_becomes_of_a_docker_shell(tmp_path):
    """It said "a tmux shell stays for the next worker to adopt" of every shell."""
    held = shell_session(tmp_path, "echo held-$((2*2))", ":close", backend="docker")
    assert "held-4" in held and "the shell stays, held by its session holder, for the next worker" in held
    assert "tmux" not in held.split("held-4", 1)[1]
    demo("delete", tmp_path)
    plain = shell_session(tmp_path / "plain", "echo plain-$((2*3))", ":close", backend="docker",
                          env={"TETHER_HOLDER": "0"})  # fmt: skip
    assert "plain-6" in plain and "the shell ends with it (" in plain, plain
    demo("delete", tmp_path / "plain", env={"TETHER_HOLDER": "0"})

"""The first process of every tmux pane: runs the program and relays its exit without losing output.

Run by tmux as ``python -I -S tmux_shim.py TMUX_BINARY [--set NAME=VALUE | --unset NAME]... -- ARGV...``
with the marker in its environment as ``TETHER_SHIM_MARKER``; the program gets it as
``TETHER_PROCESS_MARKER``. So ending the program's tree (found by that variable) leaves the shim alive to
record how the program ended; the owner ends the shim afterwards if it does not end by itself. Standard
library only, no project imports: it runs in the pane.

Why it exists (tmux 3.3a, measured): when a pane's process exits, tmux closes the pane's terminal at
once, dropping output that it had not yet read or passed to the control client (about 15 KiB of
``seq 1 300000`` was lost). So the shim outlives the program:

1. wait until the owner, once its control client is attached, unlocks ``tether-go-<marker>`` (a
   ``wait-for`` lock taken at creation), so no output is missed;
2. run the program as its child in the pane's terminal, with the environment as asked (tmux forces
   TERM, SHELL, TMUX, TMUX_PANE and TERM_PROGRAM*);
3. on its exit, record the status as the session option ``@tether_exit`` and wake ``tether-exit-<marker>``;
4. write the end sentinel to the terminal: once the owner sees it, all output before it has arrived;
5. wait until the owner, having seen the sentinel, unlocks ``tether-release-<marker>``, then end
   exactly as the program did, so tmux's ``pane_dead_status`` / ``pane_dead_signal`` are the program's.
"""

import os
import resource
import signal
import subprocess
import sys

MARKER_VARIABLE = "TETHER_PROCESS_MARKER"
SHIM_MARKER_VARIABLE = "TETHER_SHIM_MARKER"
SENTINEL = b"\x1b]7777;tether-exit;%s\x07"


def _ignore(signum: int, frame: object) -> None:
    """A handler, not SIG_IGN: handlers are reset by exec, so the program still gets default signals."""


def _tmux(*args: str) -> int:
    """A tmux command on our own server (found through $TMUX), kept off the program's terminal."""
    quiet = subprocess.DEVNULL
    return subprocess.run(args, stdin=quiet, stdout=quiet, stderr=quiet, check=False).returncode


def _through_gate(tmux: str, channel: str) -> int:
    """Wait until the owner unlocks the channel, then drop the lock again so tmux forgets the channel."""
    return _tmux(tmux, "wait-for", "-L", channel, ";", "wait-for", "-U", channel)


def main(argv: list[str]) -> None:
    tmux, rest = argv[1], argv[2:]
    split = rest.index("--")
    options, program = rest[:split], rest[split + 1 :]
    marker = os.environ[SHIM_MARKER_VARIABLE]
    pane = os.environ.get("TMUX_PANE", "")
    env = dict(os.environ)
    del env[SHIM_MARKER_VARIABLE]
    env[MARKER_VARIABLE] = marker
    for flag, value in zip(options[::2], options[1::2], strict=True):
        if flag == "--set":
            name, _, text = value.partition("=")
            env[name] = text
        else:
            env.pop(value, None)
    for signum in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _ignore)  # Ctrl-C and terminate reach the program; the shim reports

    if _through_gate(tmux, f"tether-go-{marker}") != 0:
        sys.exit(1)  # the server went away before the owner was ready: run nothing
    try:
        child = subprocess.Popen(program, env=env)
    except OSError as error:
        sys.stderr.write(f"tether: {program[0]}: {error.strerror}\r\n")
        status = 126 << 8 if isinstance(error, PermissionError) else 127 << 8
    else:
        _, status = os.waitpid(child.pid, 0)
        child.returncode = 0  # reaped here; subprocess must not try again
    recorded = f"signal:{os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"code:{os.WEXITSTATUS(status)}"
    _tmux(tmux, "set-option", "-t", pane, "@tether_exit", recorded, ";", "wait-for", "-S", f"tether-exit-{marker}")

    # A job-control shell may have left another process group in the foreground.
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(1, os.getpgrp())
    except OSError:
        pass
    try:
        os.write(1, SENTINEL % marker.encode())
    except OSError:
        pass  # the terminal is gone (session killed): nobody is waiting for the sentinel
    _through_gate(tmux, f"tether-release-{marker}")

    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        sys.exit(128 + signum)  # only if that signal cannot end a process
    sys.exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main(sys.argv)

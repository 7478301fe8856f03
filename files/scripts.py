"""The small sh programs a worker runs on a machine to move files (in a container by docker exec, as its shells
run there; on a host as the worker's user), and how it runs them. POSIX sh with busybox's or coreutils'
``readlink -f``, ``stat -c``, ``dd``, ``sha256sum`` and ``tar``: what the images Tether runs have.

Each program gets the machine's allowed paths (one per line) first, then its own arguments; it resolves the
path on the machine (links followed) and refuses one that resolves outside them. Exit codes: 0 done,
``REFUSED`` outside the allowed paths, ``MISSING`` no such file or directory, ``WRONG_KIND`` a directory where
a file is wanted or the other way round, ``ELSEWHERE`` an upload's bytes are not where the caller says
(stdout says how many there are), ``DENIED`` permission denied; stdout (or stderr) says what happened."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

REFUSED, MISSING, WRONG_KIND, ELSEWHERE, DENIED = 20, 21, 22, 23, 24
SECONDS = 60.0  # one program's time at most: a chunk, a listing, a rename or an extraction

PRELUDE = r"""
roots=$1; shift
inside() {
  while IFS= read -r root; do
    [ -n "$root" ] || continue
    [ "$root" = / ] && return 0
    case "$1" in "$root"|"$root"/*) return 0 ;; esac
  done <<EOF
$roots
EOF
  return 1
}
resolved() {  # $1 -> $real (links followed), refused outside the roots
  real=$(readlink -f -- "$1" 2>/dev/null) && [ -e "$real" ] || { echo "no such file or directory: $1"; exit 21; }
  inside "$real" || { echo "$1 leads to $real, outside the paths this machine allows"; exit 20; }
}
upload_dir() {  # the directory an upload to $1 goes into -> $dir, and its temporary file for transfer $2 -> $tmp
  parent=$(dirname -- "$1")
  dir=$(readlink -f -- "$parent" 2>/dev/null) && [ -d "$dir" ] || { echo "no such directory: $parent"; exit 21; }
  inside "$dir" || { echo "$parent leads to $dir, outside the paths this machine allows"; exit 20; }
  name=$(basename -- "$1")
  tmp="$dir/.$name.tether-upload-$2"
}
"""

LIST = (
    PRELUDE
    + r"""
resolved "$1"
[ -d "$real" ] || { echo "not a directory: $1"; exit 22; }
cd -- "$real" 2>/dev/null || { echo "permission denied: $1"; exit 24; }
echo "$real"
for f in * .[!.]* ..?*; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  stat -c '%F	%s	%a	%Y	%n' -- "$f"
done
"""
)

READ = (
    PRELUDE
    + r"""
resolved "$1"
[ -d "$real" ] && { echo "a directory, not a file: $1"; exit 22; }
[ -f "$real" ] || { echo "not a regular file: $1"; exit 22; }
[ -r "$real" ] || { echo "permission denied: $1"; exit 24; }
stat -c '%s %Y' -- "$real"
dd if="$real" bs="$3" skip="$2" count=1 2>/dev/null
"""
)

WRITE = (
    PRELUDE
    + r"""
upload_dir "$1" "$2"
[ -d "$dir/$name" ] && { echo "a directory is there: $1"; exit 22; }
size=$(stat -c %s -- "$tmp" 2>/dev/null || echo 0)
if [ "$size" = $(($3 + $4)) ] && [ "$4" != 0 ]; then cat > /dev/null; exit 0; fi
[ "$size" = "$3" ] || { cat > /dev/null; echo "$size"; exit 23; }
cat >> "$tmp" || { echo "cannot write in $dir"; exit 24; }
"""
)

FINISH = (
    PRELUDE
    + r"""
upload_dir "$1" "$2"
[ -e "$tmp" ] || : >> "$tmp" || { echo "cannot write in $dir"; exit 24; }
size=$(stat -c %s -- "$tmp")
[ "$size" = "$3" ] || { rm -f -- "$tmp"; echo "$size"; exit 23; }
sum=$(sha256sum < "$tmp") || exit 1
if [ "$4" = tar ]; then
  mkdir -p -- "$dir/$name" && tar -xf "$tmp" -C "$dir/$name"
  done=$?
  rm -f -- "$tmp"
  [ "$done" = 0 ] || { echo "the tar could not be extracted into $1"; exit 1; }
else
  [ -d "$dir/$name" ] && { rm -f -- "$tmp"; echo "a directory is there: $1"; exit 22; }
  mv -f -- "$tmp" "$dir/$name" || { rm -f -- "$tmp"; echo "cannot write $1"; exit 24; }
fi
echo "${sum%% *}"
"""
)

ABORT = (
    PRELUDE
    + r"""
upload_dir "$1" "$2"
rm -f -- "$tmp"
"""
)


class RunFailed(Exception):
    """The program could not be run there (no engine, no container, no sh)."""


async def run_here(argv: list[str], stdin: bytes | None) -> tuple[int, bytes, bytes]:
    """On this host, as the worker's user: (exit code, stdout, stderr)."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as error:
        raise RunFailed(f"cannot run sh here: {error}") from None

    async def run() -> tuple[bytes, bytes]:
        if stdin is not None:  # a program that stops early (a refusal) reads none of it: not an error here
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                process.stdin.write(stdin)
                await process.stdin.drain()
            process.stdin.close()
        return await process.communicate()

    try:
        out, err = await asyncio.wait_for(run(), SECONDS)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise RunFailed(f"the file program ran over {SECONDS:.0f} s") from None
    return process.returncode, out, err


def _frames(raw: bytes) -> tuple[bytes, bytes]:
    """stdout and stderr of an exec without a terminal: docker's 8-byte headers, then each frame."""
    out, err, at = [], [], 0
    while at + 8 <= len(raw):
        kind, size = raw[at], struct.unpack(">I", raw[at + 4 : at + 8])[0]
        (err if kind == 2 else out).append(raw[at + 8 : at + 8 + size])
        at += 8 + size
    return b"".join(out), b"".join(err)


def run_in_container(api, container: str, argv: list[str], stdin: bytes | None) -> tuple[int, bytes, bytes]:
    """By docker exec in ``container`` (its own user, as its shells), stdin written then closed; blocking."""
    created = api.exec_create(container, argv, stdin=stdin is not None, tty=False)
    conn = api.exec_start(created["Id"], socket=True)
    sock = getattr(conn, "_sock", conn)
    raw = bytearray()
    try:
        sock.settimeout(SECONDS)
        if stdin is not None:
            try:
                sock.sendall(stdin)
                sock.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):  # it stopped early (a refusal): its answer says why
                pass
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(256 * 1024):
                raw += chunk
    except OSError as error:
        raise RunFailed(f"the file program's connection failed: {error}") from None
    finally:
        with contextlib.suppress(OSError):
            sock.close()
    out, err = _frames(bytes(raw))
    code = api.exec_inspect(created["Id"]).get("ExitCode")
    return (code if code is not None else -1), out, err

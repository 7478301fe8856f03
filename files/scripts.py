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

REFUSED, MISSING, WRONG_KIND, ELSEWHERE, DENIED, CORRUPTED = 20, 21, 22, 23, 24, 25
SECONDS = 60.0  # one program's time at most: a chunk, a listing, a rename or an extraction

PRELUDE = r"""
roots=$1; shift
inside() {  # is $1 (resolved) under one of the roots (each also as it resolves here)?
  while IFS= read -r root; do
    [ -n "$root" ] || continue
    [ "$root" = / ] && return 0
    there=$(readlink -f -- "$root" 2>/dev/null) || there=$root
    for r in "$root" "$there"; do
      case "$1" in "$r"|"$r"/*) return 0 ;; esac
    done
  done <<EOF
$roots
EOF
  return 1
}
outside() { echo "$1 leads outside the paths this machine allows"; exit 20; }
resolved() {  # $1 -> $real (links followed), refused outside the roots before its existence is said
  real=$(readlink -f -- "$1" 2>/dev/null) || real=
  if [ -n "$real" ]; then inside "$real" || outside "$1"; fi
  [ -n "$real" ] && [ -e "$real" ] || { echo "no such file or directory: $1"; exit 21; }
}
target() {  # an upload to $1 (transfer $2, kind $3): where it lands -> $dest, its temporary file -> $tmp
  if [ "$3" = tar ] && { [ -e "$1" ] || [ -L "$1" ]; }; then  # into a directory there (links followed)
    dest=$(readlink -f -- "$1" 2>/dev/null) || dest=
    [ -n "$dest" ] && inside "$dest" || outside "$1"
    [ -d "$dest" ] || { echo "not a directory: $1"; exit 22; }
    dir=$dest
    tmp="$dest/.tether-upload-$2"
    return 0
  fi
  name=$(basename -- "$1")
  parent=$(dirname -- "$1")
  dir=$(readlink -f -- "$parent" 2>/dev/null) || dir=
  if [ -n "$dir" ]; then inside "$dir" || outside "$parent"; fi
  [ -n "$dir" ] && [ -d "$dir" ] || { echo "no such directory: $parent"; exit 21; }
  dest="$dir/$name"
  [ "$3" = file ] && [ -d "$dest" ] && { echo "a directory is there: $1"; exit 22; }
  tmp="$dir/.$name.tether-upload-$2"
}
"""

LIST = (
    PRELUDE
    + r"""
resolved "$1"
[ -d "$real" ] || { echo "not a directory: $1"; exit 22; }
cd -- "$real" 2>/dev/null || { echo "permission denied: $1"; exit 24; }
printf '%s\0' "$real"
n=0
for f in * .[!.]* ..?*; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  n=$((n + 1))
  [ "$n" -gt "$2" ] && { printf 'more\0'; break; }
  printf '%s\t%s\0' "$(stat -c '%F/%s/%a/%Y' -- "$f")" "$f"
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
stat -c '%s %Y %Z %i' -- "$real"
dd if="$real" bs="$3" skip="$2" count=1 2>/dev/null
"""
)

# Chunk $3 (of $6 bytes each) of upload $2 of kind $5, written in its place: a chunk sent twice lands on itself.
# The chunks before it must be there ($4: their bytes).
WRITE = (
    PRELUDE
    + r"""
if [ "$5" = tar ] && [ ! -e "$1" ] && [ ! -L "$1" ]; then
  target "$1" "$2" file
  mkdir -p -- "$dest" || { cat > /dev/null; echo "cannot make $1"; exit 1; }
fi
target "$1" "$2" "$5"
size=$(stat -c %s -- "$tmp" 2>/dev/null || echo 0)
[ "$size" -ge "$4" ] || { cat > /dev/null; echo "$size"; exit 23; }
dd of="$tmp" bs="$6" seek="$3" conv=notrunc 2>/dev/null || { cat > /dev/null; echo "cannot write in $dir"; exit 1; }
"""
)

# Into place once whole and its digest is the one sent ($4). Done before (its answer lost): the same file is there.
FINISH = (
    PRELUDE
    + r"""
if [ "$5" = tar ] && [ ! -e "$1" ] && [ ! -L "$1" ]; then
  target "$1" "$2" file
  mkdir -p -- "$dest" || { echo "cannot make $1"; exit 1; }
fi
target "$1" "$2" "$5"
if [ ! -e "$tmp" ]; then
  if [ "$3" = 0 ]; then : >> "$tmp" || { echo "cannot write in $dir"; exit 1; }
  elif [ "$5" = file ] && [ -f "$dest" ] && [ "$(sha256sum < "$dest")" = "$4  -" ]; then echo "$4"; exit 0
  else echo 0; exit 23; fi
fi
size=$(stat -c %s -- "$tmp")
[ "$size" = "$3" ] || { rm -f -- "$tmp"; echo "$size"; exit 23; }
sum=$(sha256sum < "$tmp") || exit 1
[ "$sum" = "$4  -" ] || { rm -f -- "$tmp"; echo "the bytes there are not the bytes sent"; exit 25; }
if [ "$5" = tar ]; then
  out=$(tar -xf "$tmp" -C "$dest" 2>&1)
  done=$?
  rm -f -- "$tmp"
  [ "$done" = 0 ] || { echo "the tar could not be extracted into $1: $out"; exit 1; }
else
  mv -f -- "$tmp" "$dest" || { rm -f -- "$tmp"; echo "cannot write $1"; exit 1; }
fi
echo "$4"
"""
)

ABORT = (
    PRELUDE
    + r"""
target "$1" "$2" "$3" 2>/dev/null
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

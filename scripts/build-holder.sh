#!/usr/bin/env bash
# Build the session holder (holder/tether-holder.c) into build/tether-holder: a static binary, so that it
# runs in any Linux container whatever its libc. musl-gcc (Debian's musl-tools) when it can be had, else
# gcc -static. Rebuilt only when the source is newer than the binary. Not committed.
# Also build/libtether-plain.so (terminals/screen/plain.c, the worker's scan of output for its screens, loaded
# with ctypes: the worker's own libc, so gcc; without it the worker scans in Python, slower).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[holder] %s\n' "$*"; }
die() { printf '[holder] FAILED: %s\n' "$*" >&2; exit 1; }

plain_src=terminals/screen/plain.c
plain_out=build/libtether-plain.so
if ! { [ -f "$plain_out" ] && [ "$plain_out" -nt "$plain_src" ] && [ "$plain_out" -nt "$0" ]; }; then
    mkdir -p build
    if command -v gcc >/dev/null 2>&1; then
        log "building $plain_out with gcc"
        gcc -O2 -Wall -Wextra -Werror -shared -fPIC -o "$plain_out.tmp" "$plain_src" || die "gcc could not build $plain_src"
        mv "$plain_out.tmp" "$plain_out"
    else
        log "no gcc: $plain_out not built (the worker scans output for its screens in Python)"
    fi
fi

src=holder/tether-holder.c
out=build/tether-holder
if [ -x "$out" ] && [ "$out" -nt "$src" ] && [ "$out" -nt "$0" ]; then
    exit 0
fi
if ! command -v musl-gcc >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    log "installing musl-tools"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq musl-tools >/dev/null 2>&1 \
        || { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq musl-tools >/dev/null; } \
        || log "musl-tools could not be installed; trying gcc -static"
fi
mkdir -p build
flags=(-O2 -Wall -Wextra -Werror -static -s)
if command -v musl-gcc >/dev/null 2>&1; then
    cc=musl-gcc
elif command -v gcc >/dev/null 2>&1; then
    cc=gcc
else
    die "no C compiler (musl-gcc or gcc)"
fi
log "building $out with $cc"
"$cc" "${flags[@]}" -o "$out.tmp" "$src" || die "$cc could not build $src"
mv "$out.tmp" "$out"
"$out" version >/dev/null || die "$out does not run"

#!/usr/bin/env bash
# Build the session holder (holder/tether-holder.c) into build/tether-holder: a static binary, so that it
# runs in any Linux container whatever its libc. musl-gcc (Debian's musl-tools) when it can be had, else
# gcc -static. Rebuilt only when the source is newer than the binary. Not committed.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[holder] %s\n' "$*"; }
die() { printf '[holder] FAILED: %s\n' "$*" >&2; exit 1; }

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

#!/usr/bin/env bash
# Build the browser assets into static/dist/ (not committed): the terminal bundle, xterm's CSS,
# htmx and our stylesheet. Idempotent: installs node_modules only when the lock changed and
# bundles only when a source is newer than its output, so a no-op run takes well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[frontend] %s\n' "$*"; }
die() { printf '[frontend] FAILED: %s\n' "$*" >&2; exit 1; }

if ! command -v npm >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "npm is missing and there is no apt-get to install it"
    log "installing nodejs and npm"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi

# --- node_modules: (re)install when package.json or the lock changed -----------------------------
stamp=node_modules/.tether-install.sha256
if [ -f package-lock.json ]; then
    want=$(cat package.json package-lock.json | sha256sum | cut -d' ' -f1)
else
    want=$(sha256sum package.json | cut -d' ' -f1)
fi
if [ ! -d node_modules ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    if [ -f package-lock.json ]; then
        log "npm ci"
        npm ci --no-audit --no-fund --loglevel=error
    else
        log "npm install (no package-lock.json yet)"
        npm install --no-audit --no-fund --loglevel=error
        want=$(cat package.json package-lock.json | sha256sum | cut -d' ' -f1)
    fi
    echo "$want" > "$stamp"
fi

# --- outputs: rebuild only what is older than its inputs -------------------------------------------
out=static/dist
mkdir -p "$out"

stale() {  # stale OUTPUT INPUT...: true when OUTPUT is missing or any INPUT is newer
    local output=$1; shift
    [ -e "$output" ] || return 0
    [ -n "$(find "$@" -newer "$output" -print -quit 2>/dev/null)" ]
}

if stale "$out/terminal.js" frontend package-lock.json "$0"; then
    log "bundling frontend/terminal.js"
    node_modules/.bin/esbuild frontend/terminal.js --bundle --format=iife --target=es2020 --minify \
        --sourcemap --legal-comments=linked --log-level=warning --outfile="$out/terminal.js"
fi

if stale "$out/player.js" frontend/player.js package-lock.json "$0"; then
    log "bundling frontend/player.js"
    node_modules/.bin/esbuild frontend/player.js --bundle --format=iife --target=es2020 --minify \
        --sourcemap --legal-comments=linked --log-level=warning --outfile="$out/player.js"
fi

copy() {  # copy SOURCE DEST, only when it changed
    [ -f "$1" ] || die "$1 is missing (is node_modules complete?)"
    cmp -s "$1" "$2" 2>/dev/null || { cp "$1" "$2"; log "copied $(basename "$2")"; }
}
copy node_modules/@xterm/xterm/css/xterm.css "$out/xterm.css"
copy node_modules/htmx.org/dist/htmx.min.js "$out/htmx.min.js"
copy node_modules/asciinema-player/dist/bundle/asciinema-player.css "$out/asciinema-player.css"
copy frontend/tether.css "$out/tether.css"

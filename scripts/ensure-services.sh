#!/usr/bin/env bash
# Install (when missing) and start every service the test suite talks to:
# PostgreSQL, Redis, dockerd with a locally built image, tmux, Chromium, HAProxy, Prometheus.
# Idempotent: a service already running is left alone.
set -euo pipefail

log() { printf '[services] %s\n' "$*"; }
die() { printf '[services] FAILED: %s\n' "$*" >&2; exit 1; }

APT_UPDATED=0
apt_install() {
    if [ "$APT_UPDATED" = 0 ]; then
        log "apt-get update"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        APT_UPDATED=1
    fi
    log "installing $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local seconds=$1 what=$2; shift 2
    for _ in $(seq $((seconds * 5))); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    die "$what did not come up within ${seconds}s"
}

# --- PostgreSQL -------------------------------------------------------------------------------
command -v pg_ctlcluster >/dev/null || apt_install postgresql
if ! pg_isready -q -h /var/run/postgresql; then
    version=$(ls /etc/postgresql | sort -n | tail -n1)
    [ -n "$version" ] || die "no PostgreSQL cluster configured under /etc/postgresql"
    log "starting PostgreSQL $version"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start
    wait_for 30 PostgreSQL pg_isready -q -h /var/run/postgresql
fi
# Tests connect over the socket as the current OS user; make sure that role exists.
me=$(id -un)
if ! psql -h /var/run/postgresql -d postgres -Atc 'select 1' >/dev/null 2>&1; then
    log "creating PostgreSQL role $me"
    runuser -u postgres -- psql -q -d postgres -c "CREATE ROLE \"$me\" SUPERUSER LOGIN" \
        || die "could not create PostgreSQL role $me"
fi
# `make test` runs `makemigrations --check` against the database TEST_DATABASE_URL names (`tether` by default).
# Without it, Django waits out the connection pool's 30 s timeout and then only warns that it could not check
# the migration history. Create it when it is missing (over the local socket; a remote database is the
# caller's own). pytest makes its own test_* database beside it.
test_url=${TEST_DATABASE_URL:-postgres:///tether?host=/var/run/postgresql}
if [[ "$test_url" == postgres:///* || "$test_url" == postgresql:///* ]]; then
    db=${test_url#*:///}
    db=${db%%\?*}
    exists() { [ "$(psql -h /var/run/postgresql -d postgres -Atc "select 1 from pg_database where datname = '$db'")" = 1 ]; }
    if [ -n "$db" ] && ! exists; then
        log "creating PostgreSQL database $db"
        # Another run may create it at the same moment: only its absence afterwards is a failure.
        createdb -h /var/run/postgresql "$db" 2>/dev/null || exists || die "could not create PostgreSQL database $db"
    fi
fi

# --- Redis ------------------------------------------------------------------------------------
command -v redis-server >/dev/null || apt_install redis-server
if ! redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; then
    log "starting Redis"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/tether-tests.log
    wait_for 15 Redis sh -c 'redis-cli -h 127.0.0.1 -p 6379 ping | grep -q PONG'
fi

# --- tmux, and zsh (the shell integration is tested on it too: docs/commands.md) -----------------
command -v tmux >/dev/null || apt_install tmux
command -v zsh >/dev/null || apt_install zsh

# --- Docker engine and the local test image -----------------------------------------------------
command -v dockerd >/dev/null || apt_install docker.io
[ -x /bin/busybox ] || apt_install busybox-static
if ! docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    log "starting dockerd"
    mkdir -p /var/log
    setsid nohup dockerd --iptables=false --bridge=none >/var/log/tether-dockerd.log 2>&1 < /dev/null &
    wait_for 60 dockerd docker version --format '{{.Server.Version}}'
fi
IMAGE=tether/busybox:test
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "building $IMAGE from busybox-static (no registry is reachable)"
    root=$(mktemp -d)
    mkdir -p "$root/bin" "$root/tmp" "$root/root" "$root/etc"
    cp /bin/busybox "$root/bin/busybox"
    for applet in $("$root/bin/busybox" --list); do
        [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
    done
    echo 'root:x:0:0:root:/root:/bin/sh' > "$root/etc/passwd"
    tar -C "$root" -c . | docker import -c 'ENV PATH=/bin' -c 'CMD ["/bin/sh"]' - "$IMAGE" >/dev/null
    rm -rf "$root"
fi

# --- Chromium for the browser tests -------------------------------------------------------------
[ -x /usr/bin/chromium ] || apt_install chromium

# --- HAProxy (the balancer in front of several daphnes) and Prometheus (scrapes the metrics) --------
# Only their binaries: each test starts its own, with its own configuration and ports. Their packages
# would start system-wide daemons on install; a policy-rc.d forbids that for the length of the install.
install_without_starting() {
    local policy=/usr/sbin/policy-rc.d placed=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && placed=1
    fi
    apt_install --no-install-recommends "$@" || { [ "$placed" = 0 ] || rm -f "$policy"; return 1; }
    [ "$placed" = 0 ] || rm -f "$policy"
}
command -v haproxy >/dev/null || install_without_starting haproxy
command -v prometheus >/dev/null || install_without_starting prometheus

log "ready: PostgreSQL, Redis, tmux, zsh, dockerd ($IMAGE), Chromium, HAProxy, Prometheus"

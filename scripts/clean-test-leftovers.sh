#!/usr/bin/env bash
# Remove what an interrupted test run may have left behind: labelled test containers, tmux servers on
# test sockets, and session holders of test shells. Only things the tests themselves create are touched
# (label tether.test=1, sockets tether-test-*, holders under /tmp/tether-test-held-*).
set -uo pipefail
# Every test process holds a shared lock on this file while it runs (tests/conftest.py): while one does,
# nothing here is a leftover (a `make bench` beside a running `make test` once killed its held shells), so
# nothing is touched. The exclusive lock is kept while cleaning, so a run that starts now waits for it.
exec 9>>"/tmp/tether-test-run-$(id -u).lock"
if ! flock -n -x 9; then
    echo "[clean] a test run is going on here: its containers, tmux servers and holders are left alone"
    exit 0
fi
if docker version >/dev/null 2>&1; then
    leftovers=$(docker ps -aq --filter label=tether.test=1)
    [ -n "$leftovers" ] && docker rm -f $leftovers >/dev/null
fi
for socket in /tmp/tmux-"$(id -u)"/tether-test-*; do
    [ -S "$socket" ] && tmux -S "$socket" kill-server 2>/dev/null
done
rm -f /tmp/tmux-"$(id -u)"/tether-test-*.tether-turn  # their lock files (TmuxServer.turn)
# Session holders of test shells (their directory is /tmp/tether-test-held-UID/..., or
# /tmp/tether-test-held-UID-gwN/... for each process of a parallel run).
# Each is ended by the PID its directory recorded (DIR/holder: "holder PID STARTTIME"), and only while that PID
# still has that start time: never by name, which would reach another run's holders (or a reused PID).
for record in /tmp/tether-test-held-"$(id -u)"/*/holder /tmp/tether-test-held-"$(id -u)"-gw*/*/holder; do
    [ -f "$record" ] || continue
    read -r word pid started < "$record" || continue
    [ "$word" = holder ] && [[ "$pid" =~ ^[0-9]+$ ]] || continue
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    read -r -a fields <<< "${stat##*) }"  # after the command name: field 3 (state) on; field 22 is the start time
    [ "${fields[19]:-}" = "$started" ] && kill -KILL "$pid" 2>/dev/null
done
rm -rf /tmp/tether-test-held-"$(id -u)" /tmp/tether-test-held-"$(id -u)"-gw*
rm -rf /tmp/tether-test-recordings-"$(id -u)" /tmp/tether-test-recordings-"$(id -u)"-gw*
exit 0

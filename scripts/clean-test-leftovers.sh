#!/usr/bin/env bash
# Remove what an interrupted test run may have left behind: labelled test containers, tmux servers on
# test sockets, and session holders of test shells. Only things the tests themselves create are touched
# (label tether.test=1, sockets tether-test-*, holders under /tmp/tether-test-held-*).
set -uo pipefail
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
pkill -KILL -f "tether-holder serve /tmp/tether-test-held-" 2>/dev/null
rm -rf /tmp/tether-test-held-"$(id -u)" /tmp/tether-test-held-"$(id -u)"-gw*
rm -rf /tmp/tether-test-recordings-"$(id -u)" /tmp/tether-test-recordings-"$(id -u)"-gw*
exit 0

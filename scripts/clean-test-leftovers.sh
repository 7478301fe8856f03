#!/usr/bin/env bash
# Remove what an interrupted test run may have left behind: labelled test containers and tmux servers on
# test sockets. Only things the tests themselves create are touched (label tether.test=1, sockets tether-test-*).
set -uo pipefail
if docker version >/dev/null 2>&1; then
    leftovers=$(docker ps -aq --filter label=tether.test=1)
    [ -n "$leftovers" ] && docker rm -f $leftovers >/dev/null
fi
for socket in /tmp/tmux-"$(id -u)"/tether-test-*; do
    [ -S "$socket" ] && tmux -S "$socket" kill-server 2>/dev/null
done
exit 0

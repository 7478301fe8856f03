"""An exec's process tree seen from inside its container, for engines whose pids are not ours.

Docker has no API to signal an exec, and a remote engine's host pids mean nothing here, so a small sh
script (``TREE_SCRIPT``) run by a separate exec finds the tree the way ``procfs.find_tree`` does on
this host: every process whose environment carries the exec's marker, and every process in a session
that a marked process leads (a child that dropped the marker is still in its shell's session).

The same care about identity as on the host:
- a process is known by its pid and start time, and only signalled while both still match;
- a session is known only by its number, its leader's pid, which is ours only while that marked leader
  holds it: its members are read after the leader was seen, and taken only if the leader is still there
  with the same start time afterwards, so it held the number all the while;
- a process found once stays known, so a member ignoring SIGTERM is still killed after its leader died.
That memory lasts one script run, so a whole terminate (signals, grace period, SIGKILL rounds) is one
exec. The answer is the exit code (how many processes are left), so no output has to be read back.
"""

from __future__ import annotations

import asyncio
import math
import time

import docker
import requests
from docker.errors import APIError, DockerException, NotFound

from terminals.backends.base import BackendError
from terminals.backends.procfs import MARKER_VARIABLE

KILL_ROUNDS = 100  # SIGKILL rounds of 0.1 s before the script gives up
# $1: the signals to send first ("HUP TERM"), or 0 to only count; $2: the marker (an argument, so this
# script's own environment never matches); $3: the grace period in tenths of a second before SIGKILL.
# Exits with how many processes of the tree are left alive (at most 100).
TREE_SCRIPT = f"""
m="{MARKER_VARIABLE}=$2"
known=""
stat_of() {{  # state, session and start time of pid $1; fails once it is gone
  {{ read -r line < "/proc/$1/stat"; }} 2>/dev/null || return 1
  set -- ${{line##*") "}}
  state=$1 sid=$4 start=${{20}}
}}
remember() {{ case " $known " in *" $1 "*) ;; *) known="$known $1" ;; esac; }}
scan() {{  # adds every live process of the tree to $known
  leaders="" others=""
  for d in /proc/[0-9]*; do
    p=${{d#/proc/}}
    [ "$p" = $$ ] && continue
    stat_of "$p" && [ "$state" != Z ] || continue
    if tr '\\0' '\\n' < "$d/environ" 2>/dev/null | grep -qxF "$m"; then
      remember "$p:$start"
      [ "$p" = "$sid" ] && leaders="$leaders $p:$start"
    else
      others="$others $p"
    fi
  done
  # Members are read after their leader was seen, and taken only if it still holds the number after.
  members=""
  for p in $others; do
    stat_of "$p" && [ "$state" != Z ] || continue
    case " $leaders" in *" $sid:"*) members="$members $p:$start:$sid" ;; esac
  done
  for e in $leaders; do
    p=${{e%%:*}}
    stat_of "$p" && [ "$start" = "${{e#*:}}" ] || continue
    for o in $members; do [ "${{o##*:}}" = "$p" ] && remember "${{o%:*}}"; done
  done
}}
signal() {{  # sends $1 to every known process still alive (0: none); n = how many
  n=0 alive=""
  for e in $known; do
    p=${{e%%:*}}
    stat_of "$p" && [ "$start" = "${{e#*:}}" ] && [ "$state" != Z ] || continue
    alive="$alive $e" n=$((n+1))
    [ "$1" = 0 ] || kill -"$1" "$p" 2>/dev/null
  done
  known=$alive
}}
pause() {{ sleep 0.1 2>/dev/null || sleep 1; }}
left() {{ [ "$n" -gt 100 ] && n=100; exit "$n"; }}
scan
if [ "$1" = 0 ]; then signal 0; left; fi
signal STOP; for s in $1; do signal "$s"; done; signal CONT  # frozen: no parent runs on as its child ends
i=0
while [ "$i" -lt "$3" ]; do
  scan; signal 0; [ "$n" = 0 ] && exit 0
  pause; i=$((i+1))
done
i=0
while :; do
  scan; signal 0
  [ "$n" = 0 ] || [ "$i" -ge {KILL_ROUNDS} ] && left
  signal STOP; signal KILL; pause; i=$((i+1))
done
"""


async def run_tree_script(api: docker.APIClient, container: str, marker: str, signals: str, grace: float = 0.0) -> int:
    """Run TREE_SCRIPT in a separate exec; how many processes of the tree it left alive (``signals`` "0":
    how many there are). No container, or a stopped one, has none."""
    tenths = math.ceil(grace * 10)
    timeout = 10 + grace + KILL_ROUNDS * 0.1

    def run() -> dict:
        created = api.exec_create(container, ["sh", "-c", TREE_SCRIPT, "sh", signals, marker, str(tenths)], user="0")
        # Detached: an attached exec_start waits for output without any timeout.
        api.exec_start(created["Id"], detach=True)
        deadline = time.monotonic() + timeout
        while (info := api.exec_inspect(created["Id"]))["Running"] or info["ExitCode"] is None:
            if time.monotonic() > deadline:
                raise BackendError(f"the process scan in {container!r} did not finish within {timeout:.0f}s")
            time.sleep(0.02)
        return info

    try:
        info = await asyncio.to_thread(run)
    except NotFound:
        return 0
    except APIError as error:
        if error.status_code == 409:  # the container is not running, so nothing in it is
            return 0
        raise BackendError(f"cannot reach the processes in {container!r}: {error.explanation}") from None
    except (DockerException, requests.RequestException) as error:
        raise BackendError(f"cannot reach the processes in {container!r}: {error}") from None
    if info["ExitCode"] > 100:
        raise BackendError(
            f"cannot scan processes in {container!r} (needs sh, tr, grep, kill and sleep): {info['ExitCode']}"
        )
    return info["ExitCode"]

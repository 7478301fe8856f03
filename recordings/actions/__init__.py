"""Every operation that changes a recording or a share link; each is a guarded write with its audit event on
the session. Callers outside the app use ``from recordings import actions`` and ``actions.X``.

- ``recordings``: sessions' recordings, written, finished, expired and read;
- ``shares``: share links to a live session or a recording, and who may revoke one.
"""

from recordings.actions.recordings import (
    ChunksNotHere,
    begin_recording,
    cast_lines,
    expire_recordings,
    finish_recording,
    note_recording_seen,
    remove_leftover_chunks,
    unfinished_recordings,
    write_chunk,
)
from recordings.actions.shares import (
    create_share_link,
    link_ended,
    may_revoke_share,
    note_share_opened,
    revoke_share_link,
    share_group,
    share_links_of,
    valid_share_link,
    withdraw_share_link,
)

__all__ = [
    "ChunksNotHere",
    "begin_recording",
    "cast_lines",
    "create_share_link",
    "expire_recordings",
    "finish_recording",
    "link_ended",
    "may_revoke_share",
    "note_recording_seen",
    "note_share_opened",
    "remove_leftover_chunks",
    "revoke_share_link",
    "share_group",
    "share_links_of",
    "unfinished_recordings",
    "valid_share_link",
    "withdraw_share_link",
    "write_chunk",
]

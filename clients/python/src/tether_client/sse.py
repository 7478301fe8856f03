"""Server-Sent Events, as Tether sends them: ``event``, ``id`` and one JSON ``data`` per event."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any


def events(lines: Iterable[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event type, its data) for each event in ``lines``; comments and ``retry`` left out."""
    kind, data = "message", []
    for line in lines:
        if line == "":
            if data:
                yield kind, json.loads("\n".join(data))
            kind, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                kind = value
            elif name == "data":
                data.append(value)

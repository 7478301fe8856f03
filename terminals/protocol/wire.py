"""``frontend/wire.js``, the page's copy of the protocol's words, generated (``manage.py wire_js``; a test
fails when the two differ)."""

from __future__ import annotations

from terminals.protocol import page
from terminals.protocol.words import (
    ACK_AT_ONCE_BYTES,
    ACK_IDLE_MS,
    PROTOCOL_VERSION,
    CloseCode,
    ErrorCode,
    Reason,
    Request,
    Role,
    StatusCode,
    Via,
)


def wire_js() -> str:
    """``frontend/wire.js``: the words above as the page uses them."""

    def table(enum) -> str:
        return "{\n" + "".join(f"  {m.name}: {m.value!r},\n".replace("'", '"') for m in enum) + "}"

    def types(kinds) -> str:
        return "{\n" + "".join(f'  {kind.TYPE.upper()}: "{kind.TYPE}",\n' for kind in kinds) + "}"

    auto = ", ".join(f'"{r.value}"' for r in Reason if r.auto_reset)
    return (
        "// Generated from terminals/protocol/ by `manage.py wire_js`: do not edit (a test compares them).\n\n"
        f"export const PROTOCOL_VERSION = {PROTOCOL_VERSION};\n\n"
        "// When the page acknowledges what it drew (terminals/protocol/words.py says why).\n"
        f"export const ACK_AT_ONCE_BYTES = {ACK_AT_ONCE_BYTES};\n"
        f"export const ACK_IDLE_MS = {ACK_IDLE_MS};\n\n"
        "// The types of the page's frames, and of what the server tells it (terminals/protocol/page.py): the page\n"
        "// has an on_<type> handler for each of the second (a test checks).\n"
        f"export const ToServer = Object.freeze({types(page.FROM_PAGE.values())});\n\n"
        f"export const FromServer = Object.freeze({types(page.TO_PAGE)});\n\n"
        f"export const CloseCode = Object.freeze({table(CloseCode)});\n\n"
        f"export const Reason = Object.freeze({table(Reason)});\n\n"
        f"export const ErrorCode = Object.freeze({table(ErrorCode)});\n\n"
        f"export const StatusCode = Object.freeze({table(StatusCode)});\n\n"
        f"export const Request = Object.freeze({table(Request)});\n\n"
        f"export const Role = Object.freeze({table(Role)});\n\n"
        f"export const Via = Object.freeze({table(Via)});\n\n"
        "// Ends after which the server answers a reattach with a fresh shell (TETHER_AUTO_RESET).\n"
        f"export const AUTO_RESET_REASONS = new Set([{auto}]);\n"
    )

"""Wire constants of the browser protocol (see docs/protocol.md)."""

MAX_FRAME_BYTES = 64 * 1024
MAX_COLS, MAX_ROWS = 500, 200
# A client that sends more than TETHER_STRIKE_LIMIT bad frames within this window is closed with
# POLICY_VIOLATION (the limit is a setting so that a fuzzer can be let through).
STRIKE_WINDOW_SECONDS = 10.0
ATTACH_WAIT_SECONDS = 20.0


class CloseCode:
    SUPERSEDED = 4001
    FORBIDDEN = 4003
    NOT_FOUND = 4004
    POLICY_VIOLATION = 4008
    IDLE = 4010
    DEADLINE = 4011
    OUTPUT_LIMIT = 4012
    EXITED = 4013
    SERVER_RESTART = 4014
    CLOSED = 4015
    LOGGED_OUT = 4016


# Why a session closed -> the code its viewer's socket closes with.
CLOSE_CODES = {
    "idle": CloseCode.IDLE,
    "deadline": CloseCode.DEADLINE,
    "output_limit": CloseCode.OUTPUT_LIMIT,
    "exited": CloseCode.EXITED,
    "server_restart": CloseCode.SERVER_RESTART,
    "controller_lost": CloseCode.SERVER_RESTART,
}

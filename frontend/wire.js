// Generated from terminals/protocol/ by `manage.py wire_js`: do not edit (a test compares them).

export const PROTOCOL_VERSION = 1;

// When the page acknowledges what it drew (terminals/protocol/words.py says why).
export const ACK_AT_ONCE_BYTES = 1024;
export const ACK_IDLE_MS = 25;

// The types of the page's frames, and of what the server tells it (terminals/protocol/page.py): the page
// has an on_<type> handler for each of the second (a test checks).
export const ToServer = Object.freeze({
  OBSERVE: "observe",
  ATTACH: "attach",
  TAKEOVER: "takeover",
  RESIZE: "resize",
  RESET: "reset",
  ACK: "ack",
  KEEPALIVE: "keepalive",
  PING: "ping",
});

export const FromServer = Object.freeze({
  HELLO: "hello",
  STATUS: "status",
  ERROR: "error",
  CLOSED: "closed",
  PONG: "pong",
  TAKEN_OVER: "taken_over",
  GAP: "gap",
  WARNING: "warning",
  SUPERSEDED: "superseded",
  RESET: "reset",
  ATTACHED: "attached",
  EXIT: "exit",
  COMMAND: "command",
  GRID: "grid",
  OBSERVERS: "observers",
});

export const CloseCode = Object.freeze({
  PAGE_LEFT: 4000,
  SUPERSEDED: 4001,
  FORBIDDEN: 4003,
  POLICY_VIOLATION: 4008,
  IDLE: 4010,
  DEADLINE: 4011,
  OUTPUT_LIMIT: 4012,
  EXITED: 4013,
  SERVER_RESTART: 4014,
  CLOSED: 4015,
  SHARE_ENDED: 4016,
});

export const Reason = Object.freeze({
  EXITED: "exited",
  RESET: "reset",
  KILLED: "killed",
  FAILED: "failed",
  COMPLETED: "completed",
  SPAWN_FAILED: "spawn_failed",
  NEVER_STARTED: "never_started",
  SERVER_RESTART: "server_restart",
  IDLE: "idle",
  DEADLINE: "deadline",
  OUTPUT_LIMIT: "output_limit",
  CONTROLLER_LOST: "controller_lost",
  LET_GO: "let_go",
  POLICY_VIOLATION: "policy_violation",
  LOGGED_OUT: "logged_out",
  NOT_ALLOWED: "not_allowed",
  SHARE_REVOKED: "share_revoked",
  SHARE_EXPIRED: "share_expired",
});

export const ErrorCode = Object.freeze({
  ATTACH_REFUSED: "attach_refused",
  NOT_HELD: "not_held",
  SUPERSEDED: "superseded",
  BAD_FRAME: "bad_frame",
  READ_ONLY: "read_only",
  NOT_WATCHING: "not_watching",
  NOT_WRITER: "not_writer",
});

export const StatusCode = Object.freeze({
  STARTING: "starting",
  NO_WORKER: "no_worker",
  NOT_KEPT: "not_kept",
  OWNER_LOST: "owner_lost",
});

export const Request = Object.freeze({
  CANCEL: "cancel",
  KILL: "kill",
  FAIL: "fail",
  RESET: "reset",
  COMPLETE: "complete",
});

export const Role = Object.freeze({
  WRITER: "writer",
  OBSERVER: "observer",
});

export const Via = Object.freeze({
  OWN: "",
  TEAM: "team",
  STAFF: "staff",
  SHARE_LINK: "share link",
});

// Ends after which the server answers a reattach with a fresh shell (TETHER_AUTO_RESET).
export const AUTO_RESET_REASONS = new Set(["exited", "reset", "killed", "failed", "completed", "spawn_failed", "never_started", "server_restart"]);

// Words and numbers of docs/protocol.md as the page uses them. The protocol's own words (close codes,
// reasons, codes) come from wire.js, which is generated from terminals/protocol/.

import { AUTO_RESET_REASONS, CloseCode, Reason } from "./wire.js";

export { CloseCode, ErrorCode, Reason, Role, StatusCode, ToServer, Via } from "./wire.js";

export const STATUS = {
  connecting: "Connecting…",
  connected: "Connected",
  reconnecting: "Reconnecting to your session…",
  // This page gave up reaching Tether (the network, a restart): the shell itself is not ended by that.
  unreachable: "Cannot reach Tether: this page stopped trying",
  superseded: "Superseded by another window",
  starting: "Starting a fresh shell…",
};

// Said beside an outcome Tether itself does not know (the state `unknown`), never for a network blip.
export const UNKNOWN_DETAIL =
  "Tether lost the worker that ran this shell, so how it ended is not known. The machine starts no new shell " +
  "until an operator has checked it and resolved it (Admin → Executions).";

// What an operator's request did, as the exit tells it (`by`, `action`, `why`).
const ACTION_WORDS = {
  complete: "asked it to finish",
  kill: "killed it",
  fail: "ended it as failed",
  cancel: "cancelled it",
  reset: "reset it",
};

// Ends that were nobody's choice for this shell, said so (the outcome alone, "Killed", would not).
const REASON_WORDS = {
  [Reason.SERVER_RESTART]: "Ended: the Tether worker holding it was stopped, and a shell like this cannot outlive it",
};

// How the shell ended, in a user's words: who ended it when an operator did, else its outcome.
export function endedText(exitSeen, fallback) {
  if (REASON_WORDS[exitSeen?.reason] && !exitSeen?.by) return REASON_WORDS[exitSeen.reason];
  if (exitSeen?.by) {
    const why = exitSeen.why ? ` (${exitSeen.why})` : "";
    return `Closed by ${exitSeen.by}, who ${ACTION_WORDS[exitSeen.action] ?? "ended it"}${why}`;
  }
  return exitSeen?.outcome ?? fallback;
}

// What a close means for the page (docs/protocol.md, "Close codes"). A closed socket is never a
// failed command: an outcome is shown only when the server said it (`exit`) or the code says so.
//   superseded: keep the frame, offer Take over     login: go to the login page
//   ended: show `text`, offer `next` (`failed`: shown as an error)   retry: reconnect with backoff
export function closeVerdict(code, { exitSeen, closedInfo, idleMinutes }) {
  const reason = closedInfo?.reason ?? exitSeen?.reason;
  if (exitSeen?.state === "unknown") {
    // Not the page's trouble: Tether lost the shell. A new one needs an operator first; Start a new shell
    // asks the server, which says so plainly until then.
    return { kind: "ended", text: exitSeen.outcome, next: "reopen", detail: UNKNOWN_DETAIL, failed: true };
  }
  switch (code) {
    case CloseCode.SUPERSEDED:
      return { kind: "superseded" };
    case CloseCode.FORBIDDEN:
      return { kind: "login" };
    case CloseCode.EXITED:
      return { kind: "ended", text: endedText(exitSeen, "The shell exited"), next: "new-shell" };
    case CloseCode.IDLE:
      return { kind: "ended", text: `Closed: idle for ${closedInfo?.idle_minutes ?? idleMinutes} min`, next: "reopen" };
    case CloseCode.DEADLINE:
      return { kind: "ended", text: "Closed: session deadline reached", next: "reopen" };
    case CloseCode.OUTPUT_LIMIT:
      return { kind: "ended", text: "Closed: output limit reached", next: "reopen" };
    case CloseCode.CLOSED:
      return {
        kind: "ended",
        text: endedText(exitSeen, `Closed: ${closedInfo?.text || reason || "the session was closed"}`),
        next: AUTO_RESET_REASONS.has(reason) ? "new-shell" : "reopen",
      };
    case CloseCode.SHARE_ENDED:
      // The share link this page watched through was revoked or expired: nothing to reconnect to.
      return { kind: "ended", text: closedInfo?.text || "This share link has ended", next: null };
    case CloseCode.POLICY_VIOLATION:
      return { kind: "ended", text: "Disconnected: too many bad frames", next: "reconnect", failed: true };
  }
  // An exit was seen but the close was not the usual EXITED: the shell still ended as it said.
  if (exitSeen) return { kind: "ended", text: endedText(exitSeen), next: "new-shell" };
  return { kind: "retry" };
}

export function warningText({ reason, seconds_left: secondsLeft }) {
  const left = secondsLeft >= 90 ? `${Math.round(secondsLeft / 60)} min` : `${Math.max(0, Math.round(secondsLeft))} s`;
  return reason === "idle"
    ? `Idle: this session closes in ${left} unless you type or keep it open`
    : `Session deadline: this session closes in ${left}`;
}

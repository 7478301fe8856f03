// Words and numbers of docs/protocol.md as the page uses them.

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
  server_restart: "Ended: the Tether worker holding it was stopped, and a shell like this cannot outlive it",
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

// Closes whose reattach the server answers with a fresh shell (TETHER_AUTO_RESET).
const AUTO_RESET_REASONS = new Set([
  "exited", "killed", "failed", "server_restart", "spawn_failed", "never_started", "reset", "completed",
]);

// What a close means for the page (docs/protocol.md, "Close codes"). A closed socket is never a
// failed command: an outcome is shown only when the server said it (`exit`) or the code says so.
//   superseded: keep the frame, offer Take over     login: go to the login page
//   ended: show `text`, offer `next`                 retry: reconnect with backoff
export function closeVerdict(code, { exitSeen, closedInfo, idleMinutes }) {
  const reason = closedInfo?.reason ?? exitSeen?.reason;
  if (exitSeen?.state === "unknown") {
    // Not the page's trouble: Tether lost the shell. A new one needs an operator first; Start a new shell
    // asks the server, which says so plainly until then.
    return { kind: "ended", text: exitSeen.outcome, next: "reopen", detail: UNKNOWN_DETAIL };
  }
  switch (code) {
    case 4001:
      return { kind: "superseded" };
    case 4003:
    case 4016:
      return { kind: "login" };
    case 4013:
      return { kind: "ended", text: endedText(exitSeen, "The shell exited"), next: "new-shell" };
    case 4010:
      return { kind: "ended", text: `Closed: idle for ${closedInfo?.idle_minutes ?? idleMinutes} min`, next: "reopen" };
    case 4011:
      return { kind: "ended", text: "Closed: session deadline reached", next: "reopen" };
    case 4012:
      return { kind: "ended", text: "Closed: output limit reached", next: "reopen" };
    case 4015:
      return {
        kind: "ended",
        text: endedText(exitSeen, `Closed: ${closedInfo?.text || reason || "the session was closed"}`),
        next: AUTO_RESET_REASONS.has(reason) ? "new-shell" : "reopen",
      };
    case 4008:
      return { kind: "ended", text: "Disconnected: too many bad frames", next: "reconnect" };
  }
  // An exit was seen but the close was not the usual 4013: the shell still ended as it said.
  if (exitSeen) return { kind: "ended", text: endedText(exitSeen), next: "new-shell" };
  return { kind: "retry" };
}

export function warningText({ reason, seconds_left: secondsLeft }) {
  const left = secondsLeft >= 90 ? `${Math.round(secondsLeft / 60)} min` : `${Math.max(0, Math.round(secondsLeft))} s`;
  return reason === "idle"
    ? `Idle: this session closes in ${left} unless you type or keep it open`
    : `Session deadline: this session closes in ${left}`;
}

// The client side of docs/protocol.md: one viewer socket at a time, attach by offset,
// acks, reconnect with backoff, supersede/take over, exits and resets, regrids.

import { InputGate } from "./input.js";
import { CloseCode, closeVerdict, ErrorCode, STATUS, StatusCode, warningText } from "./protocol.js";
import { ReplayWatch } from "./replay.js";
import { markerLine } from "./screen.js";

const ACK_EVERY_BYTES = 64 * 1024; // well inside the worker's flow window (TETHER_FLOW_HIGH_BYTES)
const BACKOFF_FIRST_MS = 250;
const BACKOFF_MAX_MS = 5000;
const GIVE_UP_AFTER_MS = 2 * 60 * 1000; // a worker restart plus lease expiry fits well inside this
const ATTACH_WAIT_MS = 10 * 1000;
const ATTACH_WAIT_STARTING_MS = 25 * 1000; // the server waits up to 20 s for a worker to start the shell
const PING_EVERY_MS = 20 * 1000;
const SILENCE_LIMIT_MS = 45 * 1000;
const REGRID_DEBOUNCE_MS = 80;

export class SessionClient {
  constructor({ term, fit, screen, page, config }) {
    this.term = term;
    this.fit = fit;
    this.screen = screen;
    this.page = page; // setStatus(text, tone), showActions(names), notice(text)
    this.config = config;
    this.storageKey = `tether.terminal.${config.session}`;
    this.stored = readStored(this.storageKey);
    this.phase = "connecting";
    this.ws = null;
    this.connId = 0;
    this.generation = null;
    this.epoch = null; // the owner's stream our offsets count in; it changes when a new worker adopts the shell
    this.lastAck = 0;
    this.attachedNow = false;
    this.replay = new ReplayWatch(screen, () => this.replaySettled());
    this.input = new InputGate({
      live: () => this.phase === "live" && this.attachedNow && this.ws?.readyState === WebSocket.OPEN,
      replaying: () => this.replay.active,
      send: (bytes) => {
        this.ws.send(bytes);
        this.page.warn(null); // input is activity: the worker's idle clock starts again
      },
      notice: (text) => this.page.notice(text),
    });
    this.attempt = 0;
    this.failingSince = null;
    this.timers = {};
    this.status = "";
    screen.onRendered = () => this.onRendered();
  }

  // --- connecting ---------------------------------------------------------------------

  start() {
    this.timers.ping = setInterval(() => this.ping(), PING_EVERY_MS);
    if (this.config.owner) {
      // Another user's shell: nothing is attached (nobody is superseded) until the person confirms.
      this.setPhase("foreign", `This is ${this.config.owner}'s shell`, "warn");
      this.page.showActions(["takeover"]);
      return;
    }
    this.connect("attach");
  }

  connect(kind) {
    // Into another user's shell every connect (a regrid, a reconnect) is the take-over it was confirmed as.
    if (this.config.owner && this.phase !== "foreign") kind = "takeover";
    this.clearTimer("retry");
    this.fitNow();
    const id = ++this.connId;
    Object.assign(this, { kind, sawHello: false, attachedNow: false, exitSeen: null, closedInfo: null });
    Object.assign(this, { confirmed: false, confirming: false, streamPos: 0 });
    this.serverSaidLost = false;
    // A regrid keeps its banner (and its "suspended" phase, so no output is drawn before `attached`).
    if (this.phase !== "reconnecting" && this.phase !== "suspended") this.setPhase("connecting", STATUS.connecting, "info");
    this.page.showActions([]);
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}${this.config.wsPath}`);
    ws.binaryType = "arraybuffer";
    ws.onmessage = (event) => id === this.connId && this.onFrame(event.data);
    ws.onclose = (event) => id === this.connId && this.onClose(event.code);
    this.ws = ws;
    this.lastMessageAt = Date.now();
    this.armAttachTimer(ATTACH_WAIT_MS);
  }

  // Let go of the current socket; its late events are ignored (connId moves on).
  dropSocket(code = CloseCode.PAGE_LEFT, reason = "") {
    this.connId += 1;
    this.attachedNow = false;
    this.replay.stop();
    this.clearTimer("attach");
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) this.ws.close(code, reason);
    this.ws = null;
  }

  send(message) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(message));
  }

  // --- frames from the server ---------------------------------------------------------

  onFrame(data) {
    this.lastMessageAt = Date.now();
    if (typeof data !== "string") {
      this.onOutput(new Uint8Array(data));
      return;
    }
    let message;
    try {
      message = JSON.parse(data);
    } catch {
      return;
    }
    const handler = this[`on_${message.type}`];
    if (handler) handler.call(this, message);
  }

  onOutput(bytes) {
    if (this.phase === "suspended") return; // output for the old grid: the reattach replays it
    if (!this.attachedNow) {
      // Before `attached`, the server only sends the archived screen of a closed session.
      if (this.screen.empty) this.screen.writeUnsequenced(bytes);
      return;
    }
    // Offsets are absolute, so a byte that is already on screen is recognised and dropped.
    const start = this.streamPos;
    this.streamPos += bytes.length;
    const have = this.screen.received;
    if (this.streamPos <= have) return;
    if (start < have) bytes = bytes.subarray(have - start);
    else if (start > have) this.screen.start(start); // not announced by a gap: continue where the server is
    this.screen.writeOutput(bytes);
    this.replay.sawOutput();
  }

  async on_hello() {
    const id = this.connId;
    this.sawHello = true;
    // Everything handed to xterm is parsed before we say where we are.
    await this.screen.drained();
    if (id !== this.connId) return;
    // A fresh page (or a reset) has nothing on screen: ask for the whole buffer.
    const since = this.generation === null ? 0 : this.screen.rendered;
    const message = { type: this.kind, since, generation: this.generation, epoch: this.epoch };
    if (this.term.cols > 0 && this.term.rows > 0) Object.assign(message, { cols: this.term.cols, rows: this.term.rows });
    this.send(message);
  }

  on_status(message) {
    if (message.code === StatusCode.NO_WORKER) {
      this.serverSaidLost = true;
      this.setPhase(this.phase, message.text, "error");
      return;
    }
    if (!this.attachedNow) {
      this.setPhase(this.phase, message.text, "info");
      this.armAttachTimer(ATTACH_WAIT_STARTING_MS);
    }
  }

  on_attached(message) {
    this.clearTimer("attach");
    const sameShell = this.generation !== null && message.generation === this.generation;
    if (this.generation !== null && !sameShell) this.screen.clear(); // a different shell than the one on screen
    const reloadedIntoNewShell =
      this.stored && this.stored.generation !== null && this.stored.generation !== message.generation;
    this.stored = null;
    if (reloadedIntoNewShell && this.screen.empty) {
      this.screen.writeMarker(
        markerLine("[a fresh shell was started since this tab last showed the session]", { newlineFirst: false }),
      );
    }
    this.generation = message.generation;
    if (sameShell && message.fresh) {
      // The same shell under a new owner worker: its stream restarts with the screen as it is now.
      this.screen.clear();
      this.screen.writeMarker(markerLine("[the session moved to another worker; screen redrawn]", { newlineFirst: false }));
    }
    this.epoch = message.epoch ?? null;
    // Where the stream starts; bytes before what is already on screen are skipped in onOutput.
    this.streamPos = message.offset;
    if (!sameShell || message.fresh || message.offset > this.screen.received) this.screen.start(message.offset);
    // The worker's flow window now starts at `offset`: say at once how far we really are.
    this.lastAck = Math.min(this.lastAck, message.offset);
    if (message.lost > 0) {
      const text = message.screen
        ? `[... ${message.lost} bytes of output were not kept; below is the screen as it is now ...]`
        : `[... ${message.lost} bytes of earlier output were lost ...]`;
      this.screen.writeMarker(markerLine(text, { newlineFirst: !this.screen.empty }));
    }
    if (message.screen) {
      this.screen.writeUnsequenced(Uint8Array.from(atob(message.screen), (c) => c.charCodeAt(0)));
    } else if (message.lost > 0) {
      // The retained tail may begin inside an escape sequence or a mode: a soft reset (DECSTR, SGR 0)
      // puts the terminal in a sane state without wiping what is on screen.
      this.screen.writeMarker("\x1b[!p\x1b[0m");
    }
    if (this.confirming) {
      this.confirming = false; // the answer to our own confirmation: already live, no new replay phase
      this.onRendered();
      return;
    }
    this.attachedNow = true;
    this.attempt = 0;
    this.failingSince = null;
    // "Connected" is shown once the replay is drawn: keys typed before that are dropped.
    this.setPhase("live", this.status, "info");
    this.page.showActions([]);
    this.page.warn(null);
    this.replay.begin(message.end);
    this.onRendered();
    this.persist();
  }

  // Ask once more from what we have, on the same socket: anything of the replay that went missing
  // between worker and server comes again, and what is already on screen is skipped by offset.
  // (A message for one consumer can be lost while another consumer in the same daphne is torn
  // down, e.g. the window we just superseded; `attached.end` would let us skip this.)
  confirmReplay() {
    if (this.confirmed || !this.attachedNow) return;
    this.confirmed = true;
    if (this.replay.end !== null && this.screen.received >= this.replay.end) return;
    this.confirming = true;
    const message = { type: "attach", since: this.screen.received, generation: this.generation, epoch: this.epoch };
    if (this.term.cols > 0 && this.term.rows > 0) Object.assign(message, { cols: this.term.cols, rows: this.term.rows });
    this.send(message);
  }

  on_gap(message) {
    this.streamPos = message.offset;
    if (message.offset > this.screen.received) {
      this.screen.skipTo(message.offset, markerLine(`[... ${message.lost} bytes of earlier output were lost ...]`));
    }
  }

  on_exit(message) {
    if (message.reason === "reset") return; // a reset we asked for: `reset` follows
    this.exitSeen = message;
    this.attachedNow = false;
    this.replay.stop();
    this.setPhase(this.phase, message.outcome, message.state === "unknown" ? "error" : "done");
  }

  on_reset() {
    const previous = this.exitSeen;
    this.exitSeen = null;
    this.stored = null; // the marker below already says a new shell started
    this.attachedNow = false;
    this.replay.stop();
    this.screen.clear();
    this.generation = null;
    this.epoch = null;
    this.confirmed = false; // the new shell's first attach deserves the same check
    this.confirming = false;
    this.lastAck = 0;
    if (previous) this.screen.writeMarker(markerLine(`[previous shell: ${previous.outcome}]`, { newlineFirst: false }));
    this.setPhase("connecting", STATUS.starting, "info");
    this.armAttachTimer(ATTACH_WAIT_STARTING_MS);
    this.persist();
  }

  on_superseded(message) {
    this.becomeSuperseded(message.text);
  }

  on_closed(message) {
    this.closedInfo = message;
  }

  on_error(message) {
    if (message.code === ErrorCode.NOT_HELD) {
      // The worker let go of the session; the server is finding it again and will send `attached`.
      this.attachedNow = false;
      this.setPhase("connecting", STATUS.reconnecting, "warn");
      this.armAttachTimer(ATTACH_WAIT_STARTING_MS);
      return;
    }
    this.page.notice(`Server: ${message.message}`);
  }

  on_pong() {}

  // The worker will close the session soon (idle or deadline); typing or Keep open resets idleness.
  on_warning(message) {
    this.page.warn(warningText(message), message.reason === "idle");
  }

  keepOpen() {
    this.send({ type: "keepalive" });
    this.page.warn(null);
  }

  // --- closes -------------------------------------------------------------------------

  onClose(code) {
    this.connId += 1; // nothing more from this socket
    this.ws = null;
    this.attachedNow = false;
    this.replay.stop();
    this.clearTimer("attach");
    const verdict = closeVerdict(code, {
      exitSeen: this.exitSeen,
      closedInfo: this.closedInfo,
      idleMinutes: this.config.idleMinutes,
    });
    if (verdict.kind === "superseded") return this.becomeSuperseded();
    if (verdict.kind === "login") return this.goToLogin();
    if (verdict.kind === "ended") return this.ended(verdict.text, verdict.next, verdict.detail, verdict.failed);
    if (this.serverSaidLost) return this.giveUp();
    this.scheduleReconnect(this.sawHello);
  }

  becomeSuperseded(text = STATUS.superseded) {
    // Keep the last rendered frame exactly as it is: no clear, no replay, no refit.
    if (this.phase === "superseded") return;
    this.dropSocket(1000);
    this.setPhase("superseded", text, "warn");
    this.page.showActions(["takeover"]);
  }

  ended(text, next, detail = null, failed = false) {
    this.setPhase("ended", text, failed ? "error" : "done");
    this.page.showActions([next]);
    if (detail) this.page.warn(detail);
  }

  scheduleReconnect(sawHello) {
    this.failingSince ??= Date.now();
    if (Date.now() - this.failingSince > GIVE_UP_AFTER_MS) return this.giveUp();
    this.setPhase("reconnecting", STATUS.reconnecting, "warn");
    // A browser cannot see why a handshake was refused: ask the page whether we are still welcome.
    if (!sawHello) this.probePage();
    const base = Math.min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS * 2 ** this.attempt);
    this.attempt += 1;
    this.timers.retry = setTimeout(() => this.connect("attach"), base / 2 + (Math.random() * base) / 2);
  }

  async probePage() {
    try {
      const response = await fetch(location.href, { redirect: "manual", cache: "no-store", credentials: "same-origin" });
      if (response.type === "opaqueredirect") this.goToLogin();
      else if (response.status === 404) this.giveUp("This terminal is not available to you any more.");
    } catch {
      // The network itself is down: keep backing off.
    }
  }

  giveUp(why) {
    this.clearTimer("retry");
    this.dropSocket(1000);
    this.setPhase("lost", STATUS.unreachable, "error");
    this.page.showActions(["reconnect"]);
    if (why) this.page.notice(why);
  }

  goToLogin() {
    this.clearTimer("retry");
    this.setPhase("lost", "Signed out: taking you to the login page…", "error");
    location.assign(this.config.loginUrl);
  }

  // --- actions from the page ----------------------------------------------------------

  takeOver() {
    this.attempt = 0;
    this.failingSince = null;
    if (this.phase === "foreign") this.phase = "connecting"; // confirmed: from now on every connect takes over
    this.connect("takeover");
  }

  startNewShell() {
    this.attempt = 0;
    this.failingSince = null;
    this.connect("attach"); // the server answers a closed session's attach with a fresh shell
  }

  reconnect() {
    this.startNewShell();
  }

  reset() {
    if (!this.attachedNow) {
      this.page.notice("Not connected: the shell was not reset.");
      return false;
    }
    this.send({ type: "reset" });
    return true;
  }

  // --- replay and acks ----------------------------------------------------------------

  replaySettled() {
    if (!this.attachedNow) return;
    this.setPhase("live", STATUS.connected, "ok");
    this.input.report();
    this.confirmReplay();
  }

  onRendered() {
    this.replay.check();
    if (!this.attachedNow) return;
    const rendered = this.screen.rendered;
    const drained = this.screen.pending === 0;
    if (rendered - this.lastAck >= ACK_EVERY_BYTES || (drained && rendered > this.lastAck)) {
      this.send({ type: "ack", offset: rendered });
      this.lastAck = rendered;
      this.persist();
    }
  }

  // --- grids --------------------------------------------------------------------------

  // A new grid only for a box (or font) that changed: for the same box xterm's proposal can alternate
  // between two grids (its DOM renderer's cell width depends on the column count), and each answer would
  // cost a reconnect. As the seed says: ignore notifications when the containing box did not change size.
  boxSize() {
    const box = this.term.element?.parentElement?.getBoundingClientRect();
    return box ? `${Math.round(box.width)}x${Math.round(box.height)}` : "";
  }

  onContainerResize({ force = false } = {}) {
    if (!force && this.fittedBox && this.boxSize() === this.fittedBox) return;
    this.clearTimer("regrid");
    this.timers.regrid = setTimeout(() => this.regridIfChanged(force), REGRID_DEBOUNCE_MS);
  }

  async regridIfChanged(force = false) {
    if (!force && this.boxSize() === this.fittedBox) return;
    const dims = this.fit.proposeDimensions();
    if (!dims || !(dims.cols > 0 && dims.rows > 0)) return;
    if (dims.cols === this.term.cols && dims.rows === this.term.rows) {
      this.fittedBox = this.boxSize();
      return;
    }
    if (this.phase === "superseded" || this.phase === "ended" || this.phase === "lost") return; // keep the frame
    if (!this.ws) {
      this.fitNow(true); // no socket: the next connect attaches with the new grid
      return;
    }
    // One connection has one grid: suspend output, close, fit, reattach for a fresh seed.
    this.setPhase("suspended", this.status, "info");
    this.dropSocket(CloseCode.PAGE_LEFT, "grid change");
    await this.screen.drained();
    this.fitNow(true);
    this.connect("attach");
  }

  fitNow(force = false) {
    if (!force && this.fittedBox && this.boxSize() === this.fittedBox) return;
    this.fittedBox = this.boxSize();
    const dims = this.fit.proposeDimensions();
    if (dims && dims.cols > 0 && dims.rows > 0 && (dims.cols !== this.term.cols || dims.rows !== this.term.rows)) {
      this.fit.fit();
    }
  }

  // --- housekeeping -------------------------------------------------------------------

  ping() {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return;
    if (Date.now() - this.lastMessageAt > SILENCE_LIMIT_MS) {
      // Not even a pong: the path is dead without having said so.
      this.dropSocket(CloseCode.PAGE_LEFT, "silent");
      this.scheduleReconnect(true);
      return;
    }
    this.send({ type: "ping" });
  }

  armAttachTimer(ms) {
    this.clearTimer("attach");
    const id = this.connId;
    this.timers.attach = setTimeout(() => {
      if (id !== this.connId || this.attachedNow) return;
      this.dropSocket(CloseCode.PAGE_LEFT, "attach timed out");
      this.scheduleReconnect(true);
    }, ms);
  }

  clearTimer(name) {
    clearTimeout(this.timers[name]);
    delete this.timers[name];
  }

  setPhase(phase, text, tone) {
    if (phase !== "live" && phase !== "suspended") this.page.warn(null);
    this.phase = phase;
    this.status = text;
    this.page.setStatus(text, tone, phase);
  }

  persist() {
    try {
      sessionStorage.setItem(this.storageKey, JSON.stringify({ generation: this.generation, offset: this.screen.rendered }));
    } catch {
      // Storage full or disabled: a reload then simply replays from the start.
    }
  }
}

function readStored(key) {
  try {
    const value = JSON.parse(sessionStorage.getItem(key) || "null");
    return value && typeof value === "object" ? value : null;
  } catch {
    return null;
  }
}

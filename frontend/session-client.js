// The client side of docs/protocol.md: one viewer socket at a time, attach by offset,
// acks, reconnect with backoff, supersede/take over, exits and resets, regrids.

import { Backoff } from "./backoff.js";
import { Connection } from "./connection.js";
import { GridWatch } from "./grid.js";
import { InputGate } from "./input.js";
import { CloseCode, closeVerdict, ErrorCode, STATUS, StatusCode, warningText } from "./protocol.js";
import { ReplayWatch } from "./replay.js";
import { markerLine, showLoss } from "./screen.js";
import { StoredPosition } from "./stored.js";

const ACK_EVERY_BYTES = 64 * 1024; // well inside the worker's flow window (TETHER_FLOW_HIGH_BYTES)
const ATTACH_WAIT_MS = 10 * 1000;
const ATTACH_WAIT_STARTING_MS = 25 * 1000; // the server waits up to 20 s for a worker to start the shell

export class SessionClient {
  constructor({ term, fit, screen, page, config }) {
    this.term = term;
    this.fit = fit;
    this.screen = screen;
    this.page = page; // setStatus(text, tone), showActions(names), notice(text)
    this.config = config;
    this.position = new StoredPosition(config.session);
    this.stored = this.position.load();
    this.phase = "connecting";
    this.conn = new Connection({
      path: config.wsPath,
      onFrame: (data) => this.onFrame(data),
      onClose: (code) => this.onClose(code),
      onSilent: () => {
        this.dropSocket(CloseCode.PAGE_LEFT, "silent");
        this.scheduleReconnect(true);
      },
    });
    this.generation = null;
    this.epoch = null; // the owner's stream our offsets count in; it changes when a new worker adopts the shell
    this.lastAck = 0;
    this.attachedNow = false;
    this.replay = new ReplayWatch(screen, () => this.replaySettled());
    this.input = new InputGate({
      live: () => this.phase === "live" && this.attachedNow && this.conn.open,
      replaying: () => this.replay.active,
      send: (bytes) => {
        this.conn.sendBytes(bytes);
        this.page.warn(null); // input is activity: the worker's idle clock starts again
      },
      notice: (text) => this.page.notice(text),
    });
    this.backoff = new Backoff();
    this.grid = new GridWatch({ term, fit });
    this.timers = {};
    this.status = "";
    screen.onRendered = () => this.onRendered();
  }

  // --- connecting ---------------------------------------------------------------------

  start() {
    this.conn.start();
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
    this.grid.fitNow();
    Object.assign(this, { kind, sawHello: false, attachedNow: false, exitSeen: null, closedInfo: null });
    Object.assign(this, { confirmed: false, confirming: false, streamPos: 0 });
    this.serverSaidLost = false;
    // A regrid keeps its banner (and its "suspended" phase, so no output is drawn before `attached`).
    if (this.phase !== "reconnecting" && this.phase !== "suspended") this.setPhase("connecting", STATUS.connecting, "info");
    this.page.showActions([]);
    this.conn.connect();
    this.armAttachTimer(ATTACH_WAIT_MS);
  }

  // Let go of the current socket; its late events are ignored.
  dropSocket(code = CloseCode.PAGE_LEFT, reason = "") {
    this.attachedNow = false;
    this.replay.stop();
    this.clearTimer("attach");
    this.conn.drop(code, reason);
  }

  send(message) {
    this.conn.send(message);
  }

  // --- frames from the server ---------------------------------------------------------

  onFrame(data) {
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
    const id = this.conn.id;
    this.sawHello = true;
    // Everything handed to xterm is parsed before we say where we are.
    await this.screen.drained();
    if (id !== this.conn.id) return;
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
    showLoss(this.screen, message);
    if (this.confirming) {
      this.confirming = false; // the answer to our own confirmation: already live, no new replay phase
      this.onRendered();
      return;
    }
    this.attachedNow = true;
    this.backoff.reset();
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
    const wait = this.backoff.next();
    if (wait === null) return this.giveUp();
    this.setPhase("reconnecting", STATUS.reconnecting, "warn");
    // A browser cannot see why a handshake was refused: ask the page whether we are still welcome.
    if (!sawHello) this.probePage();
    this.timers.retry = setTimeout(() => this.connect("attach"), wait);
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
    this.backoff.reset();
    if (this.phase === "foreign") this.phase = "connecting"; // confirmed: from now on every connect takes over
    this.connect("takeover");
  }

  startNewShell() {
    this.backoff.reset();
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

  onContainerResize({ force = false } = {}) {
    this.grid.notice(force, (forced) => this.regridIfChanged(forced));
  }

  async regridIfChanged(force = false) {
    if (!force && !this.grid.boxChanged()) return;
    if (!this.grid.proposedChange()) return;
    if (this.phase === "superseded" || this.phase === "ended" || this.phase === "lost") return; // keep the frame
    if (!this.conn.present) {
      this.grid.fitNow(true); // no socket: the next connect attaches with the new grid
      return;
    }
    // One connection has one grid: suspend output, close, fit, reattach for a fresh seed.
    this.setPhase("suspended", this.status, "info");
    this.dropSocket(CloseCode.PAGE_LEFT, "grid change");
    await this.screen.drained();
    this.grid.fitNow(true);
    this.connect("attach");
  }

  // --- housekeeping -------------------------------------------------------------------

  armAttachTimer(ms) {
    this.clearTimer("attach");
    const id = this.conn.id;
    this.timers.attach = setTimeout(() => {
      if (id !== this.conn.id || this.attachedNow) return;
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
    this.position.save(this.generation, this.screen.rendered);
  }
}

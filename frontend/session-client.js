// The client side of docs/protocol.md: the lifecycle of one viewer socket at a time (connect, closes,
// reconnect with backoff, supersede/take over, regrids, the page's actions). What arrives on an attached
// socket (offsets, replay, acks, exits, resets) is AttachedStream's.

import { AttachedStream } from "./attached-stream.js";
import { Backoff } from "./backoff.js";
import { Connection, probeWelcome } from "./connection.js";
import { GridWatch } from "./grid.js";
import { InputGate } from "./input.js";
import { CloseCode, closeVerdict, ErrorCode, Reason, Role, STATUS, StatusCode, ToServer, warningText } from "./protocol.js";

const ATTACH_WAIT_MS = 10 * 1000;
const ATTACH_WAIT_STARTING_MS = 25 * 1000; // the server waits up to 20 s for a worker to start the shell

export class SessionClient {
  constructor({ term, fit, screen, page, config, commands }) {
    this.term = term;
    this.commands = commands; // the command rail (commands.js): told of every attach and `command`
    this.fit = fit;
    this.screen = screen;
    this.page = page; // setStatus(text, tone), showActions(names), notice(text)
    this.config = config;
    // A writer (types, owns the grid) or an observer (watches read-only, drawing the writer's grid).
    this.role = config.role === Role.OBSERVER ? Role.OBSERVER : Role.WRITER;
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
    this.stream = new AttachedStream({
      screen,
      session: config.session,
      send: (message) => this.send(message),
      grid: () => term,
      onSettled: () => {
        this.setPhase("live", STATUS.connected, "ok");
        this.input.report();
      },
      onLoss: (lost, redrawn) => this.page.gap(lost, redrawn),
    });
    this.input = new InputGate({
      live: () => this.phase === "live" && this.stream.live && this.conn.open,
      replaying: () => this.stream.replay.active,
      send: (bytes) => {
        this.conn.sendBytes(bytes);
        this.page.warn(null); // input is activity: the worker's idle clock starts again
      },
      notice: (text) => this.page.notice(text),
      readOnly: () =>
        this.observing ? `You are watching ${this.config.owner}'s shell read-only: your keys are not sent` : null,
    });
    this.backoff = new Backoff();
    this.grid = new GridWatch({ term, fit });
    this.timers = {};
    this.status = "";
    screen.onRendered = () => this.stream.rendered();
  }

  // --- connecting ---------------------------------------------------------------------

  start() {
    this.conn.start();
    this.connect(ToServer.ATTACH);
  }

  get observing() {
    return this.role === Role.OBSERVER;
  }

  connect(kind) {
    // An observer's every connect watches; into another user's shell every connect after the take-over
    // (a regrid, a reconnect) is the take-over it was confirmed as.
    if (this.observing) kind = ToServer.OBSERVE;
    else if (this.config.owner) kind = ToServer.TAKEOVER;
    this.clearTimer("retry");
    if (!this.observing) this.grid.fitNow();
    Object.assign(this, { kind, sawHello: false, closedInfo: null });
    this.stream.newSocket();
    this.serverSaidLost = false;
    // A regrid keeps its banner (and its "suspended" phase, so no output is drawn before `attached`).
    if (this.phase !== "reconnecting" && this.phase !== "suspended") this.setPhase("connecting", STATUS.connecting, "info");
    this.page.showActions([]);
    this.conn.connect();
    this.armAttachTimer(ATTACH_WAIT_MS);
  }

  // Let go of the current socket; its late events are ignored.
  dropSocket(code = CloseCode.PAGE_LEFT, reason = "") {
    this.stream.stop();
    this.clearTimer("attach");
    this.conn.drop(code, reason);
  }

  send(message) {
    this.conn.send(message);
  }

  // --- frames from the server ---------------------------------------------------------

  onFrame(data) {
    if (typeof data !== "string") {
      // Output for the old grid while suspended: the reattach replays it.
      if (this.phase !== "suspended") this.stream.output(new Uint8Array(data));
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

  async on_hello() {
    const id = this.conn.id;
    this.sawHello = true;
    // Everything handed to xterm is parsed before we say where we are.
    await this.screen.drained();
    if (id !== this.conn.id) return;
    this.send(this.stream.request(this.kind));
  }

  on_status(message) {
    if (message.code === StatusCode.NO_WORKER) {
      this.serverSaidLost = true;
      this.setPhase(this.phase, message.text, "error");
      return;
    }
    if (!this.stream.live) {
      this.setPhase(this.phase, message.text, "info");
      this.armAttachTimer(ATTACH_WAIT_STARTING_MS);
    }
  }

  on_attached(message) {
    this.clearTimer("attach");
    this.page.durability(message.ends_with_worker || "");
    const regrid = this.phase === "suspended"; // our own reattach for a new grid, not a coming back
    // An observer draws the writer's grid from the start of what it is sent.
    if (message.role === Role.OBSERVER) this.page.drawGrid(message.cols, message.rows);
    if (!this.stream.attached(message)) return;
    this.backoff.reset();
    // "Connected" is shown once the replay is drawn: keys typed before that are dropped.
    this.setPhase("live", this.status, "info");
    this.page.showActions(this.observing && this.config.canTakeOver ? ["takeover"] : []);
    this.page.warn(null);
    this.page.watchers(message.observers || []);
    this.commands?.attached({ tell: !regrid });
  }

  // The writer's grid changed: draw the new one once everything before it is drawn on the old one.
  on_grid(message) {
    if (this.observing) this.screen.then(() => this.page.drawGrid(message.cols, message.rows));
  }

  on_observers(message) {
    this.page.watchers(message.observers);
  }

  // Someone else wrote into this shell (a take-over): said once per take-over in this browser.
  on_taken_over(message) {
    const key = `tether.takenOver.${this.config.session}`;
    try {
      if (localStorage.getItem(key) === message.at) return;
      localStorage.setItem(key, message.at);
    } catch {
      // Storage disabled: said at every attach instead.
    }
    const at = new Date(message.at).toLocaleString([], { dateStyle: "short", timeStyle: "short" });
    this.page.notice(`${message.by} took over this shell at ${at}: what they typed is theirs`);
  }

  on_command(message) {
    this.commands?.onCommand(message);
  }

  on_gap(message) {
    this.stream.gap(message);
  }

  on_exit(message) {
    if (message.reason === Reason.RESET) return; // a reset we asked for: `reset` follows
    this.stream.exit(message);
    this.setPhase(this.phase, message.outcome, message.state === "unknown" ? "error" : "done");
    this.commands?.ended();
  }

  on_reset() {
    this.stream.reset();
    this.setPhase("connecting", STATUS.starting, "info");
    this.armAttachTimer(ATTACH_WAIT_STARTING_MS);
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
      this.stream.live = false;
      this.setPhase("connecting", STATUS.reconnecting, "warn");
      this.armAttachTimer(ATTACH_WAIT_STARTING_MS);
      return;
    }
    if (message.code === ErrorCode.READ_ONLY) {
      this.page.notice(message.message);
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
    this.send({ type: ToServer.KEEPALIVE });
    this.page.warn(null);
  }

  // --- closes -------------------------------------------------------------------------

  onClose(code) {
    this.stream.stop();
    this.clearTimer("attach");
    const verdict = closeVerdict(code, {
      exitSeen: this.stream.exitSeen,
      closedInfo: this.closedInfo,
      idleMinutes: this.config.idleMinutes,
    });
    if (verdict.kind === "superseded") return this.becomeSuperseded();
    if (verdict.kind === "login") return this.goToLogin();
    if (verdict.kind === "ended") {
      this.commands?.ended(); // a session that will not be attached again still lists its commands
      return this.ended(verdict.text, verdict.next, verdict.detail, verdict.failed);
    }
    if (this.serverSaidLost) return this.giveUp();
    this.scheduleReconnect(this.sawHello);
  }

  becomeSuperseded(text = STATUS.superseded) {
    // Keep the last rendered frame exactly as it is: no clear, no replay, no refit.
    if (this.phase === "superseded") return;
    this.dropSocket(1000);
    this.setPhase("superseded", text, "warn");
    this.page.showActions(["takeover"]);
    this.page.watchers([]);
  }

  ended(text, next, detail = null, failed = false) {
    this.setPhase("ended", text, failed ? "error" : "done");
    // An observer starts no shell: it can only watch again (a share link that ended, not even that).
    this.page.showActions(next === null ? [] : this.observing ? ["reconnect"] : [next]);
    if (detail) this.page.warn(detail);
  }

  scheduleReconnect(sawHello) {
    const wait = this.backoff.next();
    if (wait === null) return this.giveUp();
    this.setPhase("reconnecting", STATUS.reconnecting, "warn");
    // A browser cannot see why a handshake was refused: ask the page whether we are still welcome.
    if (!sawHello) this.probePage();
    this.timers.retry = setTimeout(() => this.connect(ToServer.ATTACH), wait);
  }

  async probePage() {
    const answer = await probeWelcome();
    if (answer === "login") this.goToLogin();
    else if (answer === "gone") this.giveUp("This terminal is not available to you any more.");
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
    // The watching socket goes (the worker stops listing it as watching); a new one takes over.
    if (this.observing) this.dropSocket(CloseCode.PAGE_LEFT, "taking over");
    this.role = Role.WRITER; // confirmed: from now on every connect takes over, at this window's own grid
    this.page.drawGrid(null);
    this.stream.forgetGrids();
    this.grid.fitNow(true);
    this.connect(ToServer.TAKEOVER);
  }

  startNewShell() {
    this.backoff.reset();
    this.connect(ToServer.ATTACH); // the server answers a closed session's attach with a fresh shell
  }

  reconnect() {
    this.startNewShell();
  }

  reset() {
    if (!this.stream.live) {
      this.page.notice("Not connected: the shell was not reset.");
      return false;
    }
    this.send({ type: ToServer.RESET });
    return true;
  }

  // --- grids --------------------------------------------------------------------------

  onContainerResize({ force = false } = {}) {
    this.grid.notice(force, (forced) => this.regridIfChanged(forced));
  }

  async regridIfChanged(force = false) {
    if (this.observing) {
      this.page.drawGrid(); // the writer's grid, scaled again to the new box
      return;
    }
    if (!force && !this.grid.boxChanged()) return;
    if (!this.grid.proposedChange()) return;
    if (this.phase === "superseded" || this.phase === "ended" || this.phase === "lost") return; // keep the frame
    if (!this.conn.present) {
      this.stream.forgetGrids();
      this.grid.fitNow(true); // no socket: the next connect attaches with the new grid
      return;
    }
    // One connection has one grid: suspend output, close, fit, reattach for a fresh seed.
    this.setPhase("suspended", this.status, "info");
    this.dropSocket(CloseCode.PAGE_LEFT, "grid change");
    await this.screen.drained();
    this.stream.forgetGrids();
    this.grid.fitNow(true);
    this.connect(ToServer.ATTACH);
  }

  // --- housekeeping -------------------------------------------------------------------

  armAttachTimer(ms) {
    this.clearTimer("attach");
    const id = this.conn.id;
    this.timers.attach = setTimeout(() => {
      if (id !== this.conn.id || this.stream.live) return;
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
}

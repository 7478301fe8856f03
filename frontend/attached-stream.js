// One shell's stream as this page has it (docs/protocol.md, "Offsets" and "Replay"): which shell
// (generation) and which owner's count (epoch) the offsets are in, where the next byte belongs, whether
// the replay after `attached` is still being drawn, how far we have acked, and the markers a change of
// shell leaves on screen. No socket, no phases, no reconnects: SessionClient sends what this asks it to
// and decides what the page says.

import { ReplayWatch } from "./replay.js";
import { markerLine, showLoss } from "./screen.js";
import { StoredPosition } from "./stored.js";
import { ACK_AT_ONCE_BYTES, ACK_IDLE_MS, ToServer } from "./wire.js";

const ACK_EVERY_BYTES = 64 * 1024; // well inside the worker's flow window (TETHER_FLOW_HIGH_BYTES)

export class AttachedStream {
  // send(message): on the current socket. grid(): the terminal's {cols, rows}. onSettled(): the replay
  // is drawn and the stream is live.
  constructor({ screen, session, send, grid, onSettled, onLoss = () => {} }) {
    this.screen = screen;
    this.send = send;
    this.grid = grid;
    this.onSettled = onSettled;
    this.onLoss = onLoss; // (bytes lost, redrawn): output before the stream was not kept
    this.position = new StoredPosition(session);
    this.stored = this.position.load();
    this.generation = null;
    this.epoch = null; // the owner's stream our offsets count in; it changes when a new worker adopts the shell
    this.lastAck = 0;
    this.ackTimer = null;
    this.replay = new ReplayWatch(screen, () => this.replaySettled());
    this.ahead = []; // [offset, cols, rows]: grids the output from `offset` was drawn for (drawnFor)
    this.ownGrid = null; // the grid the page asks for while it draws a replay at another
    this.newSocket();
  }

  // A new socket: nothing attached on it yet.
  newSocket() {
    this.live = false;
    this.confirmed = false;
    this.confirming = false;
    this.streamPos = 0;
    this.exitSeen = null;
  }

  stop() {
    this.live = false;
    this.replay.stop();
    clearTimeout(this.ackTimer);
    this.ackTimer = null;
  }

  // An attach (or take-over) from what is on screen; a fresh page (or a reset) asks for the whole buffer.
  request(type, since = null) {
    if (since === null) since = this.generation === null ? 0 : this.screen.rendered;
    const message = { type, since, generation: this.generation, epoch: this.epoch };
    const { cols, rows } = this.ownGrid ?? this.grid(); // (not a grid the replay is drawn at for a while)
    if (cols > 0 && rows > 0) Object.assign(message, { cols, rows });
    return message;
  }

  // The grids what an attach sends was drawn for, when they are not the shell's now (a screen kept before a
  // resize, output from before it: `drawn_for` in terminals/owner/replay.py): the terminal takes each from its
  // offset, then the grid the shell has now at the replay's end, so the page draws what the worker's emulator
  // did. Where part of the replay is on screen already, it was drawn at this page's grid: nothing is changed.
  drawnFor(message) {
    this.ahead = [];
    const grids = message.grids ?? [];
    const fromItsStart = Boolean(message.screen) || this.screen.received <= message.offset;
    if (!grids.length || !fromItsStart || this.confirming) {
      const own = this.ownGrid;
      if (own) this.screen.then(() => this.resizeTo(own), { always: true });
      this.ownGrid = null;
      return;
    }
    this.ownGrid = { cols: message.cols, rows: message.rows };
    const [, cols, rows] = grids[0];
    // Now, when nothing is queued: the page's own lines (written again over a screen's reset) are taken at it.
    if (this.screen.pending === 0) this.resizeTo({ cols, rows });
    else this.screen.then(() => this.resizeTo({ cols, rows }), { always: true });
    this.ahead = [...grids.slice(1), [message.end, message.cols, message.rows]];
  }

  // The grid changes up to `offset` (output before it written), in order with the output.
  // (Resizes run even if the stream restarts before xterm reaches them: the last one queued is the page's grid.)
  gridsUpTo(offset) {
    while (this.ahead.length && this.ahead[0][0] <= offset) {
      const [, cols, rows] = this.ahead.shift();
      this.screen.then(() => this.resizeTo({ cols, rows }), { always: true });
      if (!this.ahead.length) this.ownGrid = null;
    }
  }

  // The page fitted itself to a grid of its own (a new box, a take-over): the grids of a replay still being
  // drawn are not followed any more, and the page asks for its own.
  forgetGrids() {
    this.ahead = [];
    this.ownGrid = null;
  }

  resizeTo({ cols, rows }) {
    const term = this.screen.term;
    if (cols > 0 && rows > 0 && (term.cols !== cols || term.rows !== rows)) term.resize(cols, rows);
  }

  output(bytes) {
    if (!this.live) {
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
    let at = this.streamPos - bytes.length;
    while (this.ahead.length && this.ahead[0][0] <= this.streamPos) {
      const cut = Math.max(0, this.ahead[0][0] - at);
      if (cut > 0) this.screen.writeOutput(bytes.subarray(0, cut));
      bytes = bytes.subarray(cut);
      at += cut;
      this.gridsUpTo(at);
    }
    if (bytes.length) this.screen.writeOutput(bytes);
    this.replay.sawOutput();
  }

  // True when this attach begins a replay (false for the answer to our own confirmation: already live).
  attached(message) {
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
    // Where the stream starts; bytes before what is already on screen are skipped in output().
    this.streamPos = message.offset;
    if (!sameShell || message.fresh || message.offset > this.screen.received) this.screen.start(message.offset);
    // The worker's flow window now starts at `offset`: say at once how far we really are.
    this.lastAck = Math.min(this.lastAck, message.offset);
    this.drawnFor(message);
    showLoss(this.screen, message);
    this.gridsUpTo(message.offset);
    if (message.lost > 0) this.onLoss(message.lost, Boolean(message.screen));
    if (this.confirming) {
      this.confirming = false;
      this.rendered({ now: true });
      return false;
    }
    this.live = true;
    this.replay.begin(message.end);
    this.rendered({ now: true });
    this.persist();
    return true;
  }

  replaySettled() {
    if (!this.live) return;
    this.onSettled();
    this.confirmReplay();
  }

  // Ask once more from what we have, on the same socket: anything of the replay that went missing
  // between worker and server comes again, and what is already on screen is skipped by offset.
  // (A message for one consumer can be lost while another consumer in the same daphne is torn
  // down, e.g. the window we just superseded; `attached.end` lets us skip this.)
  confirmReplay() {
    if (this.confirmed || !this.live) return;
    this.confirmed = true;
    if (this.replay.end !== null && this.screen.received >= this.replay.end) return;
    this.confirming = true;
    this.send(this.request(ToServer.ATTACH, this.screen.received));
  }

  gap(message) {
    this.streamPos = message.offset;
    if (message.offset > this.screen.received) {
      this.screen.skipTo(message.offset, markerLine(`[... ${message.lost} bytes of earlier output were lost ...]`));
    }
  }

  exit(message) {
    this.exitSeen = message;
    this.stop();
  }

  // The shell was reset: the next attach is a new shell, drawn on a clean screen under what became of
  // the old one.
  reset() {
    const previous = this.exitSeen;
    this.stop();
    this.newSocket(); // the new shell's first attach deserves the same check
    this.stored = null; // the marker below already says a new shell started
    this.screen.clear();
    this.generation = null;
    this.epoch = null;
    this.lastAck = 0;
    if (previous) this.screen.writeMarker(markerLine(`[previous shell: ${previous.outcome}]`, { newlineFirst: false }));
    this.persist();
  }

  // Called whenever xterm drew something: ack every 64 KiB, and whenever everything received is drawn
  // (ACK_IDLE_MS later when that is under ACK_AT_ONCE_BYTES, see wire.js; `now`: at once, as after an
  // attach, where the worker's window starts again).
  rendered({ now = false } = {}) {
    this.replay.check();
    if (!this.live) return;
    const behind = this.screen.rendered - this.lastAck;
    const drained = this.screen.pending === 0;
    if (behind >= ACK_EVERY_BYTES || (behind > 0 && (now || (drained && behind >= ACK_AT_ONCE_BYTES)))) this.ack();
    else if (behind > 0 && drained && this.ackTimer === null) this.ackTimer = setTimeout(() => this.ack(), ACK_IDLE_MS);
  }

  ack() {
    clearTimeout(this.ackTimer);
    this.ackTimer = null;
    const rendered = this.screen.rendered;
    if (!this.live || rendered <= this.lastAck) return;
    this.send({ type: ToServer.ACK, offset: rendered });
    this.lastAck = rendered;
    this.persist();
  }

  persist() {
    this.position.save(this.generation, this.screen.rendered);
  }
}

// When does a replay end? From `attached` until the replayed bytes are rendered. While it lasts,
// what xterm.js emits answers terminal queries in old output (DA, DSR, cursor reports) and must
// not reach the shell. A server that sends `attached.end` says where it ends; otherwise the end
// is where the burst that follows `attached` goes quiet.

const REPLAY_QUIET_MS = 100;
const REPLAY_MAX_MS = 1500; // a shell that never goes quiet must not block typing for long

export class ReplayWatch {
  constructor(screen, onSettled) {
    this.screen = screen;
    this.onSettled = onSettled;
    this.active = false;
    this.target = null; // offset that, once rendered, ends the replay
    this.end = null; // `attached.end`, when the server sends it
    this.quietTimer = null;
    this.maxTimer = null;
  }

  begin(end) {
    this.stop();
    this.active = true;
    this.end = Number.isInteger(end) ? end : null;
    if (this.end !== null) {
      this.target = this.end;
    } else {
      this.armQuiet();
      this.maxTimer = setTimeout(() => this.fixTarget(), REPLAY_MAX_MS);
    }
    this.check();
  }

  sawOutput() {
    if (this.active && this.target === null) this.armQuiet();
  }

  armQuiet() {
    clearTimeout(this.quietTimer);
    this.quietTimer = setTimeout(() => this.fixTarget(), REPLAY_QUIET_MS);
  }

  fixTarget() {
    this.clearTimers();
    if (this.active && this.target === null) {
      this.target = this.screen.received;
      this.check();
    }
  }

  // Called whenever xterm finished a write.
  check() {
    if (this.active && this.target !== null && this.screen.rendered >= this.target) {
      this.stop();
      this.onSettled();
    }
  }

  stop() {
    this.clearTimers();
    this.active = false;
    this.target = null;
  }

  clearTimers() {
    clearTimeout(this.quietTimer);
    clearTimeout(this.maxTimer);
    this.quietTimer = this.maxTimer = null;
  }
}

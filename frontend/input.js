// Keys from xterm.js to the shell. Input is never queued or replayed: keys typed while the page is
// not attached are dropped and counted so the page can say so; what xterm emits while a replay
// is drawn answers queries in old output and is dropped silently.

const KEY_TO_DATA_MS = 50; // onData caused by a real key press fires within its keydown
const encoder = new TextEncoder();

const READ_ONLY_NOTICE_MS = 3000; // an observer typing is told again after this long

export class InputGate {
  constructor({ live, replaying, send, notice, readOnly = () => null }) {
    this.live = live; // () => attached, live and the socket open
    this.replaying = replaying;
    this.send = send;
    this.notice = notice;
    this.readOnly = readOnly; // () => why keys go nowhere (this window only watches), or null
    this.dropped = 0;
    this.lastKeyAt = -Infinity;
    this.toldReadOnly = -Infinity;
  }

  noteKeyPress() {
    this.lastKeyAt = performance.now();
  }

  text(data) {
    this.push(encoder.encode(data));
  }

  binary(data) {
    this.push(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff));
  }

  push(bytes) {
    const watching = this.readOnly();
    if (watching) {
      if (performance.now() - this.toldReadOnly > READ_ONLY_NOTICE_MS) {
        this.toldReadOnly = performance.now();
        this.notice(watching);
      }
      return;
    }
    if (this.live() && !this.replaying()) {
      this.send(bytes);
      return;
    }
    if (this.replaying() && performance.now() - this.lastKeyAt > KEY_TO_DATA_MS) return;
    this.dropped += 1;
  }

  // After reattaching: tell the user what did not reach the shell.
  report() {
    const n = this.dropped;
    if (n === 0) return;
    this.dropped = 0;
    this.notice(n === 1 ? "1 key typed while disconnected was not sent" : `${n} keys typed while disconnected were not sent`);
  }
}

// The terminal screen and its place in the output stream.
//
// Offsets are absolute byte positions in one generation's output (docs/protocol.md).
// `received` is where the next byte from the server belongs; `rendered` is how far
// xterm.js has actually parsed. They differ while xterm's write queue is busy, and
// only `rendered` may be acknowledged or used as `since`: a byte handed to xterm
// but not parsed yet could still be cut off by a regrid.

export class Screen {
  constructor(term, onRendered, serializer = null) {
    this.term = term;
    this.onRendered = onRendered;
    this.serializer = serializer; // (@xterm/addon-serialize) what the page has seen, kept over a screen's reset
    this.received = 0;
    this.rendered = 0;
    this.pending = 0; // writes handed to xterm whose callback has not fired yet
    this.epoch = 0; // bumped whenever the stream restarts, so stale write callbacks are ignored
    this.empty = true; // nothing of any shell is on screen (page load, or just reset)
    this.drainWaiters = [];
  }

  // The stream (re)starts at `offset`, as `attached` says.
  start(offset) {
    this.epoch += 1;
    this.received = offset;
    this.rendered = offset;
  }

  writeOutput(bytes) {
    const end = this.received + bytes.length;
    this.received = end;
    this.empty = false;
    this._write(bytes, end);
  }

  // Output before `offset` is gone (a gap): show that, then continue at `offset`.
  skipTo(offset, marker) {
    this.received = offset;
    this._write(marker, offset);
  }

  // A line of our own (lost output, a previous shell's outcome): it does not move offsets.
  writeMarker(text) {
    this._write(text, null);
  }

  // Bytes that are not part of the live stream (the archived screen of a closed session).
  writeUnsequenced(bytes) {
    this.empty = false;
    this._write(bytes, null);
  }

  // What this page shows of the shell (its normal buffer, the scrollback with it) as bytes to write again, or
  // "" when there is none or it is not all parsed yet.
  seen() {
    if (this.empty || this.pending > 0 || !this.serializer) return "";
    return this.serializer.serialize({ excludeAltBuffer: true, excludeModes: true });
  }

  // The last row of the normal screen with something on it, or the cursor's if that is lower (0: the top).
  lastRow() {
    const buffer = this.term.buffer.normal;
    let row = this.term.rows - 1;
    while (row > buffer.cursorY && !buffer.getLine(buffer.baseY + row)?.translateToString(true)) row -= 1;
    return row;
  }

  // A fresh shell: wipe the screen and forget the old generation's offsets.
  clear() {
    this.epoch += 1;
    this.term.reset();
    this.received = 0;
    this.rendered = 0;
    this.empty = true;
  }

  // Run `fn` once xterm has parsed everything written before, and before anything written after (a new grid
  // for the output that follows it); unless `always`, not once the stream has restarted meanwhile.
  then(fn, { always = false } = {}) {
    this._write("", null, fn, always);
  }

  // Resolves once xterm has parsed everything it was given.
  drained() {
    if (this.pending === 0) return Promise.resolve();
    return new Promise((resolve) => this.drainWaiters.push(resolve));
  }

  _write(data, endOffset, after = null, always = false) {
    const epoch = this.epoch;
    this.pending += 1;
    this.term.write(data, () => {
      this.pending -= 1;
      if (endOffset !== null && epoch === this.epoch) this.rendered = endOffset;
      if (after && (always || epoch === this.epoch)) after();
      if (this.pending === 0) {
        const waiters = this.drainWaiters;
        this.drainWaiters = [];
        waiters.forEach((resolve) => resolve());
      }
      this.onRendered();
    });
  }
}

// A dim line of our own on the screen, starting on a fresh line.
export function markerLine(text, { newlineFirst = true } = {}) {
  return `${newlineFirst ? "\r\n" : ""}\x1b[0;2m${text}\x1b[0m\r\n`;
}

// What an `attached` says was lost before its stream: the count, then the screen as it is now (tmux) or,
// before a retained tail that may begin inside an escape sequence or a mode, a soft reset (DECSTR, SGR 0)
// that puts the terminal in a sane state without wiping what is on screen.
export function showLoss(screen, { lost, screen: now }) {
  const bytes = now ? Uint8Array.from(atob(now), (c) => c.charCodeAt(0)) : null;
  const text = now
    ? `[... ${lost} bytes of output were not kept; below is the screen as it is now ...]`
    : `[... ${lost} bytes of earlier output were lost ...]`;
  if (bytes && lost > 0 && bytes[0] === 0x18 && bytes[1] === 0x1b && bytes[2] === 0x63) {
    // The worker's screen begins with a full reset (CAN RIS), which would take the page's own scrollback and the
    // line saying what was lost with it: what the page had seen is written again after the reset, under it that
    // line, then the screen from the top of a cleared one, as on a fresh terminal (the rest go into the
    // scrollback above it).
    // (Both read before the reset is written: after a key, xterm writes the next output at once, not queued.)
    const seen = screen.seen();
    const last = seen ? screen.lastRow() : 0;
    const { rows } = screen.term;
    screen.writeUnsequenced(bytes.subarray(0, 3));
    const above = seen
      ? `${seen}\x1b[0m\x1b[${last + 1};1H${markerLine(text)}`
      : markerLine(text, { newlineFirst: false });
    screen.writeMarker(`${above}${"\r\n".repeat(rows - 1)}\x1b[H`);
    screen.writeUnsequenced(bytes.subarray(3));
    return;
  }
  if (lost > 0) screen.writeMarker(markerLine(text, { newlineFirst: !screen.empty }));
  if (bytes) {
    screen.writeUnsequenced(bytes);
  } else if (lost > 0) {
    screen.writeMarker("\x1b[!p\x1b[0m");
  }
}

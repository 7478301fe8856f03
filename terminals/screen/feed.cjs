// Output written into a shell's terminal (emulator.cjs), with what the screen needs of it and no more.
//
// Output that is plain text (no control sequence, no control character but CR, LF, tab and backspace) is not
// all written when it is long: only up to its first line feed, then its last lines, as many as the screen and
// its scrollback hold and the screen's height more. A run of that many plain lines leaves the same terminal
// whatever came before it scrolled off (tests/screens/fuzz_feed.cjs compares it with writing every byte), so
// `cat` of a large file costs a scan, not an emulation.
"use strict";

const RECENT = 64 * 1024; // the latest bytes kept to find where an unfinished sequence began (serialize.cjs)
const LONG = 4096; // shorter output is written whole

// Where, in `data`, writing may go on from after its first line feed (0: nothing may be skipped). Plain text
// only; the skip ends on a CR LF with `keep` more line feeds after it, so the cursor is at the first column
// there whichever way it came.
function skippable(data, keep) {
  for (let i = 0; i < data.length; i++) {
    const byte = data[i];
    if (byte < 0x20 ? byte !== 0x0a && byte !== 0x0d && byte !== 0x09 && byte !== 0x08 : byte === 0x7f) return 0;
    if (byte === 0xc2 && i + 1 < data.length && data[i + 1] >= 0x80 && data[i + 1] <= 0x9f) return 0;
  }
  let lines = 0;
  let at = data.length;
  while (lines <= keep) {
    at = data.lastIndexOf(0x0a, at - 1);
    if (at < 0) return 0;
    lines++;
  }
  const first = data.indexOf(0x0a);
  return first < at && at > 0 && data[at - 1] === 0x0d ? at + 1 : 0;
}

// The skip is exact only on the normal screen with no region, origin and insert mode off, the parser between
// sequences and no character half read.
function plain(term) {
  const core = term._core;
  const buffer = core.buffers.active;
  return (
    buffer === core.buffers.normal &&
    buffer.scrollTop === 0 &&
    buffer.scrollBottom === term.rows - 1 &&
    !core.coreService.decPrivateModes.origin &&
    !core.coreService.modes.insertMode &&
    core._inputHandler._parser.currentState === 0 &&
    !core._inputHandler._utf8Decoder.interim[0]
  );
}

// Write `data` into `shell.term` (keeping `shell.recent`, its latest bytes).
function feed(shell, data) {
  const term = shell.term;
  const from = data.length > LONG && plain(term) ? skippable(data, shell.scrollback + 2 * term.rows + 1) : 0;
  if (from) {
    // Up to and with the first line feed (it ends what the output before left unfinished), then from the
    // start of a line, as after the CR LF the skip ends on.
    term._core.writeSync(data.subarray(0, data.indexOf(0x0a) + 1));
    term._core.writeSync("\r");
    term._core.writeSync(data.subarray(from));
  } else {
    term._core.writeSync(data);
  }
  const tail = data.length >= RECENT ? data.subarray(data.length - RECENT) : data;
  const kept = Math.min(shell.recent.length, RECENT - tail.length);
  shell.recent = Buffer.concat([shell.recent.subarray(shell.recent.length - kept), tail]);
  return from;
}

module.exports = { feed, skippable };

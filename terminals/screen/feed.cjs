// Output written into a shell's terminal (emulator.cjs), with what the screen needs of it and no more.
//
// Output that is plain text (no control sequence but colour changes, no control character but CR, LF, tab and
// backspace) is not all written when it is long: only up to its first line feed, its colour changes, then its
// last lines, as many as the screen and its scrollback hold and the screen's height more. A run of that many
// lines leaves the same terminal whatever came before it scrolled off, but for the pen the colour changes leave
// (tests/screens/fuzz_feed.cjs compares it with writing every byte), so `cat` of a large file, coloured or not,
// costs a scan, not an emulation.
"use strict";

const RECENT = 64 * 1024; // the latest bytes kept to find where an unfinished sequence began (serialize.cjs)
const LONG = 4096; // shorter output is written whole

// Where, in `data`, writing may go on from after its first line feed (0: nothing may be skipped), and the
// colour changes (SGR) in what is skipped. Plain text and SGR only (a sequence cut at the end of `data` is left
// to be written with it); the skip ends on a CR LF with `keep` more line feeds after it, so the cursor is at
// the first column there whichever way it came.
function skippable(data, keep) {
  const length = data.length;
  for (let i = 0; i < length; i++) {
    const byte = data[i];
    if (byte >= 0x20 && byte !== 0x7f) {
      if (byte === 0xc2 && i + 1 < length && data[i + 1] >= 0x80 && data[i + 1] <= 0x9f) return null;
      continue;
    }
    if (byte === 0x0a || byte === 0x0d || byte === 0x09 || byte === 0x08) continue;
    if (byte !== 0x1b) return null;
    // ESC [ params m: a colour change; anything else ends the skip.
    if (i + 1 >= length) break;
    if (data[i + 1] !== 0x5b) return null;
    let j = i + 2;
    while (j < length && ((data[j] >= 0x30 && data[j] <= 0x39) || data[j] === 0x3b || data[j] === 0x3a)) j++;
    if (j >= length) break;
    if (data[j] !== 0x6d) return null;
    i = j;
  }
  let lines = 0;
  let at = length;
  while (lines <= keep) {
    if (at <= 0) return null; // (a negative start would count from the end)
    at = data.lastIndexOf(0x0a, at - 1);
    if (at < 0) return null;
    lines++;
  }
  const first = data.indexOf(0x0a);
  if (!(first < at && at > 0 && data[at - 1] === 0x0d)) return null;
  // The pen the skipped colour changes leave: those from the last that resets it (ESC[m, ESC[0m, ESC[0;...)
  // on, found from the end.
  const region = data.subarray(first + 1, at);
  let from = Math.max(region.lastIndexOf("\x1b[m"), region.lastIndexOf("\x1b[0m"), region.lastIndexOf("\x1b[0;"), 0);
  const sgrs = [];
  while ((from = region.indexOf(0x1b, from)) >= 0) {
    const end = region.indexOf(0x6d, from);
    sgrs.push(region.subarray(from, end + 1));
    from = end + 1;
  }
  return { from: at + 1, first, sgr: Buffer.concat(sgrs) };
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

// Write `data` into `shell.term` (keeping `shell.recent`, its latest bytes). Returns how many bytes were not
// written through the parser.
function feed(shell, data) {
  const term = shell.term;
  const whole = data;
  if (data.length > LONG && !plain(term)) {
    // In the middle of a sequence (the last output cut one): written to its first line feed, then looked at.
    const lf = data.indexOf(0x0a);
    if (lf >= 0) {
      term._core.writeSync(data.subarray(0, lf + 1));
      data = data.subarray(lf + 1);
    }
  }
  const skip = data.length > LONG && plain(term) ? skippable(data, shell.scrollback + 2 * term.rows + 1) : null;
  if (skip) {
    // Up to and with the first line feed (it ends what the output before left unfinished), the colour changes
    // of what is skipped (the pen they leave), then from the start of a line, as after the CR LF the skip
    // ends on.
    term._core.writeSync(data.subarray(0, skip.first + 1));
    if (skip.sgr.length) term._core.writeSync(skip.sgr);
    term._core.writeSync("\r");
    term._core.writeSync(data.subarray(skip.from));
  } else {
    term._core.writeSync(data);
  }
  const tail = whole.length >= RECENT ? whole.subarray(whole.length - RECENT) : whole;
  const kept = Math.min(shell.recent.length, RECENT - tail.length);
  shell.recent = Buffer.concat([shell.recent.subarray(shell.recent.length - kept), tail]);
  return skip ? skip.from - skip.first - 1 - skip.sgr.length : 0;
}

module.exports = { feed, plain, skippable, RECENT };

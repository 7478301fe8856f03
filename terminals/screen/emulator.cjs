// The screens of a worker's shells: one @xterm/headless terminal (the page's own emulator) per shell, fed the
// shell's output in order, which answers with the screen as bytes (serialize.cjs) when a page must be shown the
// screen rather than a torn tail. One process per worker, spoken to over its stdin and stdout in frames:
//
//   type (1 byte) | shell (4 bytes, big-endian, the worker's number for it) | length (4 bytes) | payload
//
// From the worker:
//   O  open: JSON {cols, rows, scrollback, screen?}: a terminal (from a screen given earlier, base64, when given)
//   D  data: output bytes, in order
//   R  resize: 2 bytes cols, 2 bytes rows
//   S  screen: 4 bytes request: answered once every byte sent before it is read
//   K  the same, without the scrollback: the screen left with the session holder for the next owner
//   T  text: 4 bytes request: the rows the terminal shows as text (a closed shell's last screen, for people)
//   C  close
// To the worker:
//   A  after each O, D and R: 4 bytes, how many of those it has read for the shell | 1 byte 1 when its terminal is
//      where a long plain run may be cut short (feed.cjs's plain(): the worker then cuts runs itself, plain.py)
//   S  4 bytes request | 1 byte 0 (the screen) or 1 (none: see the text) | 4 bytes n | n bytes that the screen
//      leaves unread (the start of a sequence not yet ended) | the screen (UTF-8); to T: 4 bytes request | 0 or
//      1 | 4 bytes 0 | the rows as text (UTF-8), its blank rows at the end left out
//   E  text: a frame it could not take (the shell's terminal is dropped; its screens are answered `none`)
//
// Output is written as feed.cjs says: a long run of plain lines only in part.
"use strict";
const { Terminal } = require("@xterm/headless");
const { rebuild, unfinished } = require("./serialize.cjs");
const { feed, plain, RECENT } = require("./feed.cjs");

const HEADER = 9;

// The rows the terminal shows, as text: what a page showed (its blank rows at the end left out).
function text(term) {
  const buffer = term.buffer.active;
  const rows = [];
  for (let y = 0; y < term.rows; y++) rows.push(buffer.getLine(buffer.baseY + y)?.translateToString(true) ?? "");
  while (rows.length && !rows[rows.length - 1]) rows.pop();
  return rows.join("\n");
}

const shells = new Map(); // number -> { term, recent, broken, scrollback }
const out = process.stdout;

function send(type, id, payload) {
  const header = Buffer.alloc(HEADER);
  header.write(type, 0, "latin1");
  header.writeUInt32BE(id, 1);
  header.writeUInt32BE(payload.length, 5);
  out.write(Buffer.concat([header, payload]));
}

function acknowledge(id, shell) {
  const payload = Buffer.alloc(5);
  payload.writeUInt32BE(shell.frames, 0);
  payload[4] = plain(shell.term) ? 1 : 0;
  send("A", id, payload);
}

function fail(id, why) {
  const shell = shells.get(id);
  if (shell) {
    shell.broken = why;
    shell.term.dispose();
    shell.term = null;
  }
  send("E", id, Buffer.from(why));
}

function handle(type, id, payload) {
  if (type === "O") {
    const { cols, rows, scrollback = 200, screen = "" } = JSON.parse(payload.toString());
    const term = new Terminal({ cols, rows, scrollback, allowProposedApi: true, logLevel: "off" });
    const shell = { term, recent: Buffer.alloc(0), broken: "", scrollback, frames: 1 };
    shells.set(id, shell);
    if (screen) {
      // A screen as answered before (a sequence it ended in the middle of included): read as output was.
      const bytes = Buffer.from(screen, "base64");
      term._core.writeSync(bytes);
      shell.recent = bytes.subarray(Math.max(bytes.length - RECENT, 0));
    }
    return acknowledge(id, shell);
  }
  const shell = shells.get(id);
  if (!shell) return send("E", id, Buffer.from("no such shell"));
  if (type === "C") {
    shell.term?.dispose();
    shells.delete(id);
    return;
  }
  if (type === "S" || type === "K" || type === "T") {
    const answer = Buffer.alloc(9);
    payload.copy(answer, 0, 0, 4);
    if (shell.broken) {
      answer[4] = 1;
      return send("S", id, Buffer.concat([answer, Buffer.from(shell.broken)]));
    }
    if (type === "T") return send("S", id, Buffer.concat([answer, Buffer.from(text(shell.term))]));
    const pending = unfinished(shell.term, shell.recent);
    if (pending === null) {
      answer[4] = 1;
      return send("S", id, Buffer.concat([answer, Buffer.from("a control string began too long ago")]));
    }
    answer.writeUInt32BE(pending, 5);
    const screen = Buffer.from(rebuild(shell.term, { scrollback: type === "K" ? 0 : shell.scrollback }));
    return send("S", id, Buffer.concat([answer, shell.recent.subarray(shell.recent.length - pending), screen]));
  }
  if (shell.broken) return;
  try {
    if (type === "D") feed(shell, payload);
    else if (type === "R") shell.term.resize(payload.readUInt16BE(0), payload.readUInt16BE(2));
    else return fail(id, `a frame of type ${JSON.stringify(type)}`);
  } catch (error) {
    return fail(id, `the emulator failed: ${error}`);
  }
  shell.frames++;
  acknowledge(id, shell);
}

let pending = Buffer.alloc(0);
process.stdin.on("data", (chunk) => {
  pending = pending.length ? Buffer.concat([pending, chunk]) : chunk;
  let at = 0;
  while (pending.length - at >= HEADER) {
    const length = pending.readUInt32BE(at + 5);
    if (pending.length - at < HEADER + length) break;
    const type = String.fromCharCode(pending[at]);
    const id = pending.readUInt32BE(at + 1);
    handle(type, id, pending.subarray(at + HEADER, at + HEADER + length));
    at += HEADER + length;
  }
  pending = at ? pending.subarray(at) : pending;
});
process.stdin.on("end", () => process.exit(0));
process.stdout.on("error", () => process.exit(0)); // the worker is gone

// Fuzzing terminals/screen/serialize.cjs against @xterm/headless itself: for each of COUNT random streams
// of text and control sequences (seeded), a terminal that saw every byte is compared, in everything a program
// can set or a person can see, with a fresh one that was given `rebuild()` of the state at a random point and
// then the rest of the stream. Prints {"cases": N, "failures": [...]} (each with the seed, the split, the
// stream and what differed). Usage: node fuzz_rebuild.cjs SEED COUNT [COLS ROWS [STRIP]]
"use strict";
const { Terminal } = require("@xterm/headless");
const { rebuild, unfinished } = require("../../terminals/screen/serialize.cjs");
const { state, differences, random } = require("./state.cjs");

const [seed0, count, cols = 20, rows = 6] = process.argv.slice(2, 6).map(Number);
// A fifth argument, a text to strip from every rebuilt screen, shows the comparison sees a screen rebuilt wrong.
const strip = process.argv[6];
const SCROLLBACK = 50;

function stream(rand) {
  const pick = (list) => list[Math.floor(rand() * list.length)];
  const n = (max) => Math.floor(rand() * max);
  const E = "\x1b", C = "\x1b[";
  const pieces = [
    () => pick(["hello", "wörld", "x", "abc def", "0123456789", "ab\tcd", "line of text that goes on"]),
    () => pick(["中文", "한글", "😀", "e\u0301", "ａｂ", "☃"]),
    () => pick(["\r\n", "\r\n", "\n", "\r", "\b", "\t", "\x07"]),
    () => `${C}${pick(["0", "1", "2", "3", "4", "4:3", "4:2", "5", "7", "8", "9", "21", "22", "23", "24", "53", "1;2", "2;22", "31", "42", "95", "104", "38;5;200", "48;5;3", "38;2;10;20;30", "48:2::1:2:3", "58;5;9", "58:2::9:8:7", "59", "39", "49", ""])}m`,
    () => `${C}${1 + n(rows + 2)};${1 + n(cols + 2)}H`,
    () => `${C}${pick(["", "1", "2"])}${pick(["J", "K"])}`,
    () => `${C}${n(4)}${pick(["@", "P", "L", "M", "X", "A", "B", "C", "D", "S", "T", "G", "d", "b", "E", "F", "I", "Z"])}`,
    () => `${C}${1 + n(rows)};${1 + n(rows)}r`,
    () => `${C}r`,
    () => pick([`${E}7`, `${E}8`, `${E}M`, `${E}D`, `${E}E`, `${E}H`, `${C}s`, `${C}u`, `${E}=`, `${E}>`]),
    () => `${C}?${pick(["1049", "1047", "47", "1048"])}${pick(["h", "l"])}`,
    () => `${C}?${pick(["1", "6", "7", "25", "45", "66", "1000", "1002", "1003", "9", "1004", "1006", "1016", "2004", "2026"])}${pick(["h", "l"])}`,
    () => `${C}${pick(["4h", "4l"])}`,
    () => pick([`${E}(0`, `${E}(B`, `${E})0`, `${E}(A`, `${E}*0`, `${E}+A`, "\x0e", "\x0f", `${E}n`, `${E}o`]),
    () => `${E}]${pick(["0", "1", "2"])};${pick(["vim", "top", "", "a b"])}\x07`,
    () => `${C}${pick(["22;0", "22;1", "22;2", "23;0", "23;1", "23;2"])}t`,
    () => pick([`${C}3g`, `${C}0g`, `${C}g`]),
    () => `${C}${n(7)} q`,
    () => pick([`${C}!p`, `${E}#8`]),
    () => pick([`${C}1"q`, `${C}0"q`, `${C}2"q`, `${C}?J`, `${C}?1J`, `${C}?K`, `${C}?2K`]),
    () => "lqqk xmj ".repeat(1 + n(3)),
  ];
  let out = "";
  const length = 5 + n(120);
  for (let i = 0; i < length; i++) out += pick(pieces)();
  return out;
}

const write = (term, data) => term._core.writeSync(data);
// xterm.js itself throws on a few random streams (an erase after some region changes): those streams are
// counted apart, not compared.
let broken = 0;
const GARBAGE = Buffer.concat([  // what a page showed before: another buffer, a pen, a title, unfinished bytes
  Buffer.from("garbage\x1b[?1049h\x1b[31mx\x1b]2;old\x07\x1b]2;unfinished"), Buffer.from([0xe4]),
]);
const failures = [];
let unknown = 0;
// Known and left: a cursor (or saved cursor) in a pending wrap over a last cell that was erased after it was
// written. The pending wrap is remade by writing that cell again, so it comes back as a space (drawn the same).
let known = 0;
const erasedUnderPendingWrap = (difference) => {
  const match = /^\.(normal|alternate)\.\d+\.cells\.(\d+): "\|1\|0\|(.*)" != " \|1\|1\|(.*)"$/.exec(difference);
  return Boolean(match) && Number(match[2]) === cols - 1 && match[3] === match[4];
};
for (let i = 0; i < count; i++) {
  const seed = seed0 + i;
  const rand = random(seed);
  const data = Buffer.from(stream(rand), "utf8");
  const split = Math.floor(rand() * (data.length + 1));
  let truth = new Terminal({ cols, rows, scrollback: SCROLLBACK, allowProposedApi: true, logLevel: "off" });
  try {
    write(truth, data);
  } catch {
    broken++;
    continue;
  }
  truth.reset();
  truth.dispose();
  truth = new Terminal({ cols, rows, scrollback: SCROLLBACK, allowProposedApi: true, logLevel: "off" });
  write(truth, data.subarray(0, split));
  const pending = unfinished(truth, data.subarray(0, split));
  if (pending === null) {
    unknown++;
    truth.dispose();
    continue;
  }
  let screen = rebuild(truth, { scrollback: SCROLLBACK });
  if (strip) screen = screen.replaceAll(strip, "");
  write(truth, data.subarray(split));
  const copy = new Terminal({ cols, rows, scrollback: SCROLLBACK, allowProposedApi: true, logLevel: "off" });
  let found;
  try {
    write(copy, GARBAGE);
    write(copy, screen);
    write(copy, data.subarray(split - pending));
  } catch (error) {
    found = [`the rebuilt terminal threw: ${error}`];
  }
  const kept = Math.min(truth._core.buffers.normal.lines.length, copy._core.buffers.normal.lines.length);
  found = found || differences(state(truth, kept), state(copy, kept));
  if (found.length && found.every(erasedUnderPendingWrap)) {
    known++;
    found = [];
  }
  if (found.length) failures.push({ seed, split, pending, data: data.toString("latin1"), screen, found: found.slice(0, 6) });
  truth.dispose();
  copy.dispose();
}
process.stdout.write(JSON.stringify({ cases: count, unknown, broken, known, failures }));

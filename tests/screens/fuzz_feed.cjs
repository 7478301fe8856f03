// Fuzzing terminals/screen/feed.cjs: random streams of long plain runs (lines of every length, wide and
// combining characters, colour changes, tabs, backspaces, CR LF and bare LF, lines longer than the screen) between control
// sequences (colours, cursor moves, regions, the alternate screen, insert mode), cut into random chunks, are
// written whole into one terminal and through feed() (which skips most of a long plain run) into another:
// the two must end the same in everything tests/screens/state.cjs compares. Prints {"cases", "skipped" (bytes
// feed() did not write), "failures"}. Usage: node fuzz_feed.cjs SEED COUNT [COLS ROWS]
"use strict";
const { Terminal } = require("@xterm/headless");
const { feed } = require("../../terminals/screen/feed.cjs");
const { state, differences, random } = require("./state.cjs");

const [seed0, count, cols = 40, rows = 8] = process.argv.slice(2).map(Number);
const SCROLLBACK = 30;

function stream(rand) {
  const pick = (list) => list[Math.floor(rand() * list.length)];
  const n = (max) => Math.floor(rand() * max);
  const words = ["a", "bc", "def ", "中文", "e\u0301", "\t", "x\by", "0123456789", "ｗｉｄｅ", "😀",
    "\x1b[31m", "\x1b[0m", "\x1b[1;4:3;38;5;200m", "\x1b[m", "\x1b[48;2;1;2;3m", "\x1b[7;58:5:9m"];
  const line = () => {
    let text = "";
    const length = n(12);
    for (let i = 0; i < length; i++) text += pick(words);
    return text + pick(["\r\n", "\r\n", "\r\n", "\n", "\r\n"]);
  };
  const control = () =>
    pick([
      "\x1b[31m", "\x1b[0m", "\x1b[1;44m", `\x1b[${1 + n(rows)};${1 + n(cols)}H`, "\x1b[2J", "\x1b[K",
      `\x1b[${1 + n(3)};${rows - n(3)}r`, "\x1b[r", "\x1b[?1049h", "\x1b[?1049l", "\x1b[4h", "\x1b[4l",
      "\x1b[?6h", "\x1b[?6l", "\x1b(0", "\x1b(B", "\x1b]2;title\x07", "\x1b7", "\x1b8",
    ]);
  const parts = [];
  const length = 2 + n(8);
  for (let i = 0; i < length; i++) {
    if (rand() < 0.6) {
      // A colour set once before a long run (its lines keep it: the pen at the end is that colour).
      let run = rand() < 0.3 ? pick(["\x1b[1;35m", "\x1b[4:3;48;5;17m", "\x1b[0;7m"]) : "";
      const lines = n(3) === 0 ? n(20) : 60 + n(400);
      for (let j = 0; j < lines; j++) run += line();
      parts.push(run);
    } else {
      parts.push(control());
    }
  }
  return Buffer.from(parts.join(""));
}

const failures = [];
let skipped = 0;
for (let i = 0; i < count; i++) {
  const seed = seed0 + i;
  const rand = random(seed);
  const data = stream(rand);
  const whole = new Terminal({ cols, rows, scrollback: SCROLLBACK, allowProposedApi: true, logLevel: "off" });
  const shell = {
    term: new Terminal({ cols, rows, scrollback: SCROLLBACK, allowProposedApi: true, logLevel: "off" }),
    recent: Buffer.alloc(0),
    scrollback: SCROLLBACK,
  };
  // Chunks as a pipe gives them: mostly large, cut anywhere (in a line, a character, a sequence).
  for (let at = 0; at < data.length; ) {
    const size = rand() < 0.3 ? 1 + Math.floor(rand() * 64) : 4096 + Math.floor(rand() * 40000);
    const chunk = data.subarray(at, at + size);
    whole._core.writeSync(chunk);
    skipped += feed(shell, chunk);
    at += size;
  }
  const kept = Math.min(whole._core.buffers.normal.lines.length, shell.term._core.buffers.normal.lines.length);
  const found = differences(state(whole, kept), state(shell.term, kept));
  const tail = data.length >= 64 * 1024 ? data.subarray(data.length - 64 * 1024) : data;
  if (!shell.recent.equals(tail)) found.push("recent: not the stream's last bytes");
  if (found.length) failures.push({ seed, found: found.slice(0, 6) });
  whole.dispose();
  shell.term.dispose();
}
process.stdout.write(JSON.stringify({ cases: count, skipped, failures }));

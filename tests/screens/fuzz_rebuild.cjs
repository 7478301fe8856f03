// Fuzzing terminals/screen/serialize.cjs against @xterm/headless itself: for each of COUNT random streams
// of text and control sequences (seeded), a terminal that saw every byte is compared, in everything a program
// can set or a person can see, with a fresh one that was given `rebuild()` of the state at a random point and
// then the rest of the stream. Prints {"cases": N, "failures": [...]} (each with the seed, the split, the
// stream and what differed). Usage: node fuzz_rebuild.cjs SEED COUNT [COLS ROWS [STRIP]]
"use strict";
const { Terminal } = require("@xterm/headless");
const { rebuild, unfinished } = require("../../terminals/screen/serialize.cjs");

const [seed0, count, cols = 20, rows = 6] = process.argv.slice(2, 6).map(Number);
// A fifth argument, a text to strip from every rebuilt screen, shows the comparison sees a screen rebuilt wrong.
const strip = process.argv[6];
const SCROLLBACK = 50;

function random(seed) {
  // mulberry32
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

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

// A palette colour leaves the bits of an earlier RGB one in place; only its low byte is ever read.
const colours = (value) => ((value & 0x3000000) === 0x3000000 || (value & 0x3000000) === 0 ? value : value & ~0xffff00);

// Everything compared: the active buffer, every line kept (text, widths, attributes, null cells and soft
// wraps), the cursor, the region, the pen, the saved cursors, the sets, the tabs, the titles and the modes.
function state(term, lastLines) {
  const core = term._core;
  // A cell's underline as it is drawn: its style (single without extended attributes; none for style 0, which
  // only a DECALN fill with an underlining pen makes) and its colour (only while underlined).
  const drawnUnderline = (cell) => (cell.isUnderline() ? cell.getUnderlineStyle() : 0);
  const underlineColour = (cell) => {
    const value = drawnUnderline(cell) && cell.hasExtendedAttrs() ? cell.extended.underlineColor : 0;
    return value & 0x3000000 ? colours(value) : 0;
  };
  const cellState = (cell) => [cell.getChars(), cell.getWidth(), cell.getCode() === 0 ? 0 : 1,
    colours(drawnUnderline(cell) ? cell.fg : cell.fg & ~0x10000000), colours(cell.bg & ~0x10000000),
    drawnUnderline(cell), underlineColour(cell)].join("|");
  const dump = (buffer, take) => {
    const cell = new (buffer.getNullCell().constructor)(); // (the buffer's own null cell is not to be written)
    const out = [];
    for (let y = Math.max(buffer.lines.length - take, 0); y < buffer.lines.length; y++) {
      const line = buffer.lines.get(y);
      const cells = [];
      for (let x = 0; x < term.cols; x++) cells.push(cellState(line.loadCell(x, cell)));
      out.push({ wrapped: line.isWrapped, cells });
    }
    return out;
  };
  const buffers = core.buffers;
  // A saved row that scrolled off restores to the top row (xterm.js clamps it): it is compared as that.
  const saved = (buffer) => ({
    x: buffer.savedX, y: Math.min(Math.max(buffer.savedY - buffer.ybase, 0), rows - 1),
    fg: colours(buffer.savedCurAttrData.fg), bg: colours(buffer.savedCurAttrData.bg & ~0x10000000),
    charset: buffer.savedCharset,
  });
  // A tab stop at the column past the last (set in a pending wrap) is never reached: not compared.
  const tabs = (buffer) => Object.keys(buffer.tabs).filter((k) => buffer.tabs[k] && k < term.cols).join(",");
  const pen = core._inputHandler._curAttrData;
  return {
    active: buffers.active === buffers.normal ? "normal" : "alternate",
    normal: dump(buffers.normal, lastLines),
    alternate: buffers.active === buffers.alt ? dump(buffers.alt, rows) : null,
    cursor: [buffers.active.x, buffers.active.y],
    normalCursor: buffers.active === buffers.alt ? [buffers.normal.x, buffers.normal.y] : null,
    hidden: core.coreService.isCursorHidden,
    region: [buffers.active.scrollTop, buffers.active.scrollBottom],
    // The pen's underline style while it underlines nothing (left by a DECRC) is not compared.
    // (nor one underlined with style 0, which only a DECRC makes: it is rebuilt as a single underline).
    pen: [colours(pen.fg), colours(pen.bg & ~0x10000000), pen.isUnderline() ? pen.extended.underlineStyle || 1 : 0,
      colours(pen.extended.underlineColor)],
    savedNormal: saved(buffers.normal),
    savedAlt: buffers.active === buffers.alt ? saved(buffers.alt) : null,
    charsets: [0, 1, 2, 3].map((g) => core._charsetService._charsets[g]),
    glevel: core._charsetService.glevel,
    charset: core._charsetService.charset,
    tabs: [tabs(buffers.normal), buffers.active === buffers.alt ? tabs(buffers.alt) : null],
    titles: [core._inputHandler._windowTitle, core._inputHandler._iconName,
      core._inputHandler._windowTitleStack.join("\n"), core._inputHandler._iconNameStack.join("\n")],
    modes: { ...core.coreService.decPrivateModes, insert: core.coreService.modes.insertMode,
      mouse: core.coreMouseService.activeProtocol, encoding: core.coreMouseService.activeEncoding },
  };
}

function differences(a, b, path = "") {
  if (a === b) return [];
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) {
    return [`${path}: ${JSON.stringify(a)?.slice(0, 300)} != ${JSON.stringify(b)?.slice(0, 300)}`];
  }
  const found = [];
  for (const key of new Set([...Object.keys(a), ...Object.keys(b)])) found.push(...differences(a[key], b[key], `${path}.${key}`));
  return found;
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

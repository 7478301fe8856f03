// What the fuzzers in tests/screens/ share: the whole state of an @xterm/headless terminal, to compare two
// terminals by, and their seeded random numbers.
"use strict";

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
    x: buffer.savedX, y: Math.min(Math.max(buffer.savedY - buffer.ybase, 0), term.rows - 1),
    fg: colours(buffer.savedCurAttrData.fg), bg: colours(buffer.savedCurAttrData.bg & ~0x10000000),
    charset: buffer.savedCharset,
  });
  // A tab stop at the column past the last (set in a pending wrap) is never reached: not compared.
  const tabs = (buffer) => Object.keys(buffer.tabs).filter((k) => buffer.tabs[k] && k < term.cols).join(",");
  const pen = core._inputHandler._curAttrData;
  return {
    active: buffers.active === buffers.normal ? "normal" : "alternate",
    normal: dump(buffers.normal, lastLines),
    alternate: buffers.active === buffers.alt ? dump(buffers.alt, term.rows) : null,
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

// A seeded random number generator (mulberry32): the fuzzers' streams, the same for a seed on every run.
function random(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

module.exports = { state, differences, random };

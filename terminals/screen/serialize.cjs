// The whole state of an @xterm/headless terminal as the bytes that rebuild it in a fresh xterm.js (the page's,
// or another headless one): both buffers cell by cell (text, width, colours, every attribute, null cells apart
// from written spaces, soft wraps), which buffer is active, the cursor (a pending wrap included), its
// visibility and style, the scroll region, each buffer's saved cursor, tab stops, the pen, the character sets,
// the titles and their stacks, and every mode a program can set. `rebuild(term, {scrollback})` returns a string
// that starts with a full reset (RIS): written into any xterm.js of the same size, it leaves that terminal in
// the same state (tests/screens/ compare them cell by cell, fuzzed).
//
// Not carried (xterm.js keeps them outside the terminal's core, or not at all): OSC 8 hyperlinks (the text
// stays), colours set by OSC 4/10/11/12, and options a program can toggle (DECSET 12, LNM), which belong to
// the page.
"use strict";

const ESC = "\x1b";
const CSI = "\x1b[";

// --- colours and attributes ----------------------------------------------------------------------------------

const CM_P16 = 0x1000000;
const CM_P256 = 0x2000000;
const CM_RGB = 0x3000000;

function colour(mode, value, base, bright) {
  if (mode === CM_P16) return [value < 8 ? base + value : bright + value - 8];
  if (mode === CM_P256) return [base + 8, 5, value];
  if (mode === CM_RGB) return [base + 8, 2, (value >>> 16) & 0xff, (value >>> 8) & 0xff, value & 0xff];
  return [];
}

const HAS_EXTENDED = 0x10000000; // in bg: the cell's underline style and colour are in its `extended`
const PROTECTED = 0x20000000; // in bg: DECSCA

// The SGR that sets exactly `attr`'s pen from nothing: "0" first, so one string is the whole pen. A cell's
// `extended` is read only when it has one (a loaded cell keeps the last one it had); the pen's always (it
// keeps an underline colour while nothing is underlined).
function sgr(attr, pen = false) {
  const codes = [0];
  if (attr.isBold()) codes.push(1);
  if (attr.isDim()) codes.push(2);
  if (attr.isItalic()) codes.push(3);
  if (attr.isBlink()) codes.push(5);
  if (attr.isInverse()) codes.push(7);
  if (attr.isInvisible()) codes.push(8);
  if (attr.isStrikethrough()) codes.push(9);
  if (attr.isOverline()) codes.push(53);
  codes.push(...colour(attr.getFgColorMode(), attr.getFgColor(), 30, 90));
  codes.push(...colour(attr.getBgColorMode(), attr.getBgColor(), 40, 100));
  let text = codes.join(";");
  // A cell underlined with style 0 (a DECALN fill with an underlining pen) draws no underline: it is left
  // out. A pen cannot be set so but by a DECRC: it underlines singly here.
  if (attr.isUnderline() && (attr.getUnderlineStyle() || pen)) text += `;4:${attr.getUnderlineStyle() || 1}`;
  // The underline colour is kept (and shown once underlined) even while nothing is underlined.
  const underline = pen || attr.bg & HAS_EXTENDED ? attr.extended.underlineColor : 0;
  const value = underline & 0xffffff;
  if ((underline & CM_RGB) === CM_RGB) text += `;58:2::${(value >>> 16) & 0xff}:${(value >>> 8) & 0xff}:${value & 0xff}`;
  else if (underline & CM_P256) text += `;58:5:${value & 0xff}`;
  // DECSCA's protection (from selective erase) rides in the background's flags; SGR 0 ended it.
  return `${CSI}${text}m${attr.bg & PROTECTED ? `${CSI}1"q` : ""}`;
}

// The pen ECH erases with: the background alone (xterm.js's erase attributes).
function eraseSgr(cell) {
  return `${CSI}${[0, ...colour(cell.getBgColorMode(), cell.getBgColor(), 40, 100)].join(";")}m`;
}

function samePen(a, b) {
  return a.fg === b.fg && a.bg === b.bg && (!(a.bg & HAS_EXTENDED) ||
    (a.extended.underlineStyle === b.extended.underlineStyle && a.extended.underlineColor === b.extended.underlineColor));
}

// --- character sets ------------------------------------------------------------------------------------------

// xterm.js keeps a designated set as an object; its final byte is found by designating each one once.
const FINALS = ["B", "0", "A", "4", "C", "5", "R", "Q", "K", "Y", "E", "6", "Z", "H", "7", "="];
let finalsOf = null;

function finalOf(Terminal, charset) {
  if (!finalsOf) {
    finalsOf = new Map();
    const probe = new Terminal({ cols: 10, rows: 2, allowProposedApi: true, logLevel: "off" });
    for (const final of FINALS) {
      probe._core.writeSync(`${ESC}(${final}`);
      const found = probe._core._charsetService.charset;
      if (!finalsOf.has(found)) finalsOf.set(found, final);
    }
    probe.dispose();
  }
  return finalsOf.get(charset) || "B";
}

const DESIGNATE = ["(", ")", "*", "+"];
const INVOKE = ["\x0f", "\x0e", `${ESC}n`, `${ESC}o`];

// --- buffers -------------------------------------------------------------------------------------------------

// A null cell (nothing written, or erased) that ECH can make: the background alone (xterm.js erases so).
// Others (the cell left when a wide character is cut in two or did not fit) carry a whole pen.
function erasable(cell) {
  return cell.fg === 0 && (cell.bg & ~(CM_RGB | 0xffffff)) === 0;
}

function isNull(cell) {
  return cell.getCode() === 0 && cell.getWidth() === 1;
}

// One buffer's lines from `first` to its end, written from the cursor at home with the pen at its default.
// A row wraps into the next (soft wrap, `isWrapped`) only when a character is written past its last column,
// so a row that continues is written to its end: a null cell there as a space, erased once the next row's
// first cell is written. A first line that continues one not written is wrapped into from a row of spaces
// that scrolls off the screen (into the scrollback of the normal buffer, where it is one blank line more).
function lines(buffer, first, cols) {
  const Cell = buffer.getNullCell().constructor;
  const out = [];
  let pen = null; // the pen last set: null for the default, undefined when not known (after an erase)
  const setPen = (cell) => {
    if (pen === null && cell.fg === 0 && cell.bg === 0) return;
    if (pen && samePen(pen, cell)) return;
    out.push(sgr(cell));
    pen = cell.clone();
  };
  const plain = () => {
    if (pen !== null) out.push(`${CSI}0m`);
    pen = null;
  };
  const erase = (cell, count) => {
    out.push(eraseSgr(cell), `${CSI}${count}X`);
    pen = undefined;
  };
  const cell = new Cell();
  const probe = new Cell();
  const last = buffer.lines.length;
  let fixLast = null; // the row before's last cell, a null cell written as a space to wrap: erased after
  let wideWrap = false; // the row before ends in the null cell left by a wide character that did not fit
  let reopened = false; // the cursor is already at the start of this row (true: which continues the last)
  if (buffer.lines.get(first).isWrapped) out.push(" ".repeat(cols));
  for (let y = first; y < last; y++) {
    const line = buffer.lines.get(y);
    const nextWrapped = y + 1 < last && buffer.lines.get(y + 1).isWrapped;
    let from = 0; // where the row's cells are written from
    if (reopened) {
      // The row the cursor wrapped into from a wide character above: its remnants erased, written from its
      // start.
      if (reopened === true) {
        out.push(`\r${CSI}${cols}X`);
      }
      reopened = false;
    } else if (wideWrap) {
      // The wide character written here leaves the row before's last cell as it was, and wraps.
      line.loadCell(0, cell);
      setPen(cell);
      out.push(cell.getChars());
      plain();
      out.push(`${CSI}K`); // a row scrolled in by the wrap is filled with the pen's background
      from = 2;
      wideWrap = false;
    } else if (line.isWrapped) {
      // The row before was written to its end: this row's first cell wraps it (a space for a null cell,
      // erased once written), then the space left in the row before is erased.
      line.loadCell(0, cell);
      const blank = isNull(cell) ? cell.clone() : null;
      if (blank) {
        plain();
        out.push(" ");
      } else {
        setPen(cell);
        out.push(cell.getChars() || " ");
        from = cell.getWidth() || 1;
      }
      if (fixLast) {
        out.push(`${CSI}A${CSI}${cols}G`);
        erase(fixLast, 1);
        out.push(`${CSI}B`);
        fixLast = null;
      }
      // A row scrolled in by the wrap is filled with the pen's background: erased from past its first cell
      // (an erase from the first column would end the wrap).
      out.push(`${CSI}${Math.max(from, 1) + 1}G`);
      plain();
      out.push(`${CSI}K`);
      if (!blank) out.push(`${CSI}${from + 1}G`);
      if (blank) {
        out.push(`${CSI}1G`);
        erase(blank, 1);
        out.push(`${CSI}1G`);
      }
    }
    // The row's cells up to the last one that is not a default null cell (all of them when the next row
    // continues this one).
    let end = cols;
    if (!nextWrapped) {
      while (end > from) {
        line.loadCell(end - 1, cell);
        if (!isNull(cell) || cell.fg !== 0 || cell.bg !== 0) break;
        end--;
      }
    }
    for (let x = from; x < end; ) {
      line.loadCell(x, cell);
      if (!isNull(cell)) {
        setPen(cell);
        out.push(cell.getChars() || " ");
        x += cell.getWidth() || 1;
        continue;
      }
      if (x + 1 === cols && nextWrapped) {
        // The last cell of a row that continues: see above.
        buffer.lines.get(y + 1).loadCell(0, probe);
        wideWrap = probe.getWidth() === 2 && probe.fg === cell.fg && probe.bg === cell.bg;
        if (!wideWrap && !erasable(cell)) {
          // A wide character that did not fit, then wrapped into the next row (remade below).
          setPen(cell);
          out.push(`\u4e2d`);
          plain();
          reopened = true;
        } else if (!wideWrap) {
          plain();
          out.push(" ");
          fixLast = cell.clone();
        }
        x++;
        continue;
      }
      if (x + 1 === cols && !erasable(cell) && y + 1 < last) {
        // The cell a wide character that did not fit leaves, in the last column of a row that does not
        // continue: one written there wraps into the next row, which is then erased whole (and so no longer
        // continues this one).
        setPen(cell);
        out.push(`\u4e2d`);
        plain();
        out.push(`\r${CSI}2K`);
        reopened = "unwrapped";
        x++;
        continue;
      }
      if (!erasable(cell) && x + 1 < cols) {
        // A null cell with a whole pen: a wide character written here in that pen, cut in two by a space.
        setPen(cell);
        out.push(`\u4e2d${CSI}${x + 2}G ${CSI}${x + 2}G`);
        if (x + 1 >= end) {
          plain();
          out.push(`${CSI}X`);
        }
        x++;
        continue;
      }
      // A run of null cells with one background: erased, then stepped over.
      let run = 1;
      while (x + run < end && !(x + run + 1 === cols && nextWrapped)) {
        line.loadCell(x + run, probe);
        if (!isNull(probe) || probe.bg !== cell.bg || !erasable(probe)) break;
        run++;
      }
      erase(cell, run);
      out.push(`${CSI}${run}C`);
      x += run;
    }
    if (y + 1 < last && !nextWrapped && !reopened) {
      plain();
      out.push("\r\n");
    }
  }
  plain();
  return out.join("");
}

// --- the whole state -----------------------------------------------------------------------------------------

function cup(y, x) {
  return `${CSI}${y + 1};${x + 1}H`;
}

function tabs(buffer, cols) {
  let defaults = true;
  for (let x = 0; x < cols; x++) {
    if (Boolean(buffer.tabs[x]) !== (x % 8 === 0)) defaults = false;
  }
  if (defaults) return "";
  let out = `${CSI}3g`;
  for (let x = 0; x < cols; x++) if (buffer.tabs[x]) out += `${CSI}${x + 1}G${ESC}H`;
  return out;
}

// What one buffer keeps besides its cells, set while it is the active one (its cursor is left where it was):
// its tab stops, its scroll region (which homes the cursor) and its saved cursor (DECSC: a place, a pen's
// colours and flags, and the character set that was in GL).
function kept(Terminal, buffer, cols, rows) {
  const saved = buffer.savedCurAttrData;
  let out = tabs(buffer, cols);
  if (buffer.scrollTop !== 0 || buffer.scrollBottom !== rows - 1) {
    out += `${CSI}${buffer.scrollTop + 1};${buffer.scrollBottom + 1}r`;
  }
  const row = Math.min(Math.max(buffer.savedY - buffer.ybase, 0), rows - 1); // as DECRC takes it
  out += place(buffer, row, buffer.savedX, 0, cols) + sgr(saved, true);
  out += `${ESC}(${finalOf(Terminal, buffer.savedCharset)}\x0f${ESC}7${CSI}0m${ESC}(B`;
  return out + place(buffer, buffer.y, buffer.x, 0, cols);
}

// The cursor to (y, x) of `buffer`'s screen, `top` rows below the top in origin mode. x past the last column
// is a pending wrap: the last cell is written again there (with the default character set in GL).
function place(buffer, y, x, top, cols) {
  const line = buffer.lines.get(buffer.ybase + y);
  if (x < cols || !line) return cup(y - top, Math.min(x, cols - 1)); // (an alternate buffer never shown)
  const cell = new (buffer.getNullCell().constructor)();
  let at = cols - 1;
  line.loadCell(at, cell);
  if (cell.getWidth() === 0 && at > 0) line.loadCell(--at, cell);
  return cup(y - top, at) + sgr(cell) + (cell.getChars() || " ") + `${CSI}0m`;
}

// The cell the cursor has just left by printing it: the one before the cursor (two before for a wide one;
// the last of the row in a pending wrap). null when there is none.
function lastPrinted(buffer, cols) {
  const line = buffer.lines.get(buffer.ybase + buffer.y);
  const cell = new (buffer.getNullCell().constructor)();
  let x = Math.min(buffer.x, cols) - 1;
  if (x < 0) return null;
  line.loadCell(x, cell);
  if (cell.getWidth() === 0 && x > 0) line.loadCell(--x, cell);
  if (cell.getCode() === 0) return null;
  return { x, width: cell.getWidth() || 1, chars: cell.getChars() };
}

function rebuild(term, { scrollback = 0 } = {}) {
  const Terminal = term.constructor;
  const core = term._core;
  const { cols, rows } = term;
  const buffers = core.buffers;
  const normal = buffers.normal;
  const alt = buffers.alt;
  const active = buffers.active;
  // CAN ends whatever sequence the page's terminal was in the middle of; RIS resets it.
  const out = [`\x18${ESC}c`];

  // The normal buffer from the first line of the logical line `scrollback` rows above the screen.
  let first = Math.max(normal.ybase - scrollback, 0);
  while (first > 0 && normal.lines.get(first).isWrapped && normal.ybase - first < scrollback + rows) first--;
  out.push(lines(normal, first, cols), kept(Terminal, normal, cols, rows));
  // The alternate buffer keeps its tabs, region and saved cursor while the normal one is active.
  out.push(`${CSI}?1047h${CSI}H`);
  if (active === alt) out.push(lines(alt, 0, cols));
  out.push(kept(Terminal, alt, cols, rows));
  if (active === normal) out.push(`${CSI}?1047l`, cup(normal.y, Math.min(normal.x, cols - 1)));

  // Origin mode (which homes the cursor); the character sets and what is invoked into GL; the character set
  // in GL when a DECRC put it there and it is no longer the one invoked (only DECRC does that: this one,
  // when the saved cursor still has it); then the cursor and the pen.
  const modes = core.coreService.decPrivateModes;
  if (modes.origin) out.push(`${CSI}?6h`);
  const charsets = core._charsetService;
  for (let g = 0; g < 4; g++) {
    const final = finalOf(Terminal, charsets._charsets[g]);
    if (final !== "B") out.push(`${ESC}${DESIGNATE[g]}${final}`);
  }
  if (charsets.glevel) out.push(INVOKE[charsets.glevel]);
  if (charsets.charset !== charsets._charsets[charsets.glevel] && charsets.charset === active.savedCharset) {
    out.push(`${ESC}8`);
  }

  // The modes.
  const inputHandler = core._inputHandler;
  const insert = core.coreService.modes.insertMode;
  if (modes.applicationCursorKeys) out.push(`${CSI}?1h`);
  if (modes.applicationKeypad) out.push(`${CSI}?66h`);
  if (modes.reverseWraparound) out.push(`${CSI}?45h`);
  if (!modes.wraparound) out.push(`${CSI}?7l`);
  if (modes.sendFocus) out.push(`${CSI}?1004h`);
  if (modes.bracketedPasteMode) out.push(`${CSI}?2004h`);
  const mouse = core.coreMouseService;
  const protocol = { X10: 9, VT200: 1000, DRAG: 1002, ANY: 1003 }[mouse.activeProtocol];
  if (protocol) out.push(`${CSI}?${protocol}h`);
  const encoding = { SGR: 1006, SGR_PIXELS: 1016 }[mouse.activeEncoding];
  if (encoding) out.push(`${CSI}?${encoding}h`);
  if (core.coreService.isCursorHidden) out.push(`${CSI}?25l`);
  if (modes.cursorStyle !== undefined) {
    const shape = { block: 1, underline: 3, bar: 5 }[modes.cursorStyle] || 1;
    out.push(`${CSI}${shape + (modes.cursorBlink === false ? 1 : 0)} q`);
  }

  // The titles: each stack from its bottom, then the current ones.
  for (const title of inputHandler._iconNameStack) out.push(`${ESC}]1;${title}\x07${CSI}22;1t`);
  for (const title of inputHandler._windowTitleStack) out.push(`${ESC}]2;${title}\x07${CSI}22;2t`);
  out.push(`${ESC}]1;${inputHandler._iconName}\x07${ESC}]2;${inputHandler._windowTitle}\x07`);
  if (modes.synchronizedOutput) out.push(`${CSI}?2026h`);

  // Last, the cursor and the pen. When the program's last act was to print a character (any control
  // sequence since would have ended it), a combining character that comes next joins that one: it is
  // printed again, so the page's terminal has it as the character it last printed (in insert mode, after
  // deleting it, so the row is not pushed right). Nothing may follow it.
  const top = modes.origin ? active.scrollTop : 0;
  let pen = sgr(inputHandler._curAttrData, true);
  const current = inputHandler._curAttrData;
  const saved = active.savedCurAttrData;
  const style = current.extended.underlineStyle;
  const underlining = Boolean(current.isUnderline());
  if ((underlining ? current.bg & HAS_EXTENDED && !style : style) &&
      saved.fg === current.fg && saved.bg === current.bg && charsets.charset === active.savedCharset) {
    // A pen whose underline flag and underline style disagree (underlining with style 0, which draws none;
    // or not underlining with a style kept for the next DECRC that underlines) is made only by a DECRC of
    // one pen's colours and flags over another's underline: so is this one, from the saved cursor that
    // still has them.
    const colour = pen.match(/;58:[^m;]*/);
    out.push(`${CSI}0${style ? `;4:${style}` : ""}${colour ? colour[0] : ""}m${ESC}8`);
    pen = "";
  }
  const printed = inputHandler._parser.precedingJoinState ? lastPrinted(active, cols) : null;
  if (printed) {
    out.push(cup(active.y - top, printed.x), pen);
    if (insert) out.push(`${CSI}4h${CSI}${printed.width}P`);
    out.push(printed.chars);
  } else {
    out.push(place(active, active.y, active.x, top, cols), pen);
    if (insert) out.push(`${CSI}4h`);
  }
  return out.join("");
}

// How many of the last bytes written into `term` (`recent`, its latest bytes) belong to what it has not
// finished reading: a control sequence not yet ended, or a character's first UTF-8 bytes. Those bytes have
// done nothing yet, so the screen at the end of `recent` is `rebuild(term)` followed by them. null when the
// sequence began before `recent` (a long DCS or OSC string).
function unfinished(term, recent) {
  const inputHandler = term._core._inputHandler;
  const interim = inputHandler._utf8Decoder.interim;
  const partial = interim[0] ? (interim[2] ? 3 : interim[1] ? 2 : 1) : 0;
  if (inputHandler._parser.currentState === 0) return partial;
  for (let at = recent.length - 1; at >= 0; at--) {
    if (recent[at] === 0x1b) return recent.length - at;
    if (recent[at] === 0xc2 && at + 1 < recent.length && recent[at + 1] >= 0x80 && recent[at + 1] <= 0x9f) {
      return recent.length - at;
    }
  }
  return null;
}

module.exports = { rebuild, sgr, unfinished };

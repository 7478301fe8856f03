// The screen as the page's emulator has it: the bytes on stdin written into @xterm/headless (the same
// xterm.js the page runs) at COLS x ROWS, then printed as JSON: the active buffer, the visible rows of both
// buffers cell by cell (text and attributes), the cursor and whether it shows, the scroll region, the title
// and every mode a program can set. Usage: node xterm_screen.cjs COLS ROWS < bytes
"use strict";
const { Terminal } = require("@xterm/headless");

const [cols, rows] = process.argv.slice(2).map(Number);
const term = new Terminal({ cols, rows, scrollback: 1000, allowProposedApi: true });
let title = "";
term.onTitleChange((text) => { title = text; });

function attributes(cell) {
  return [
    cell.getFgColorMode(), cell.getFgColor(), cell.getBgColorMode(), cell.getBgColor(),
    cell.isBold(), cell.isItalic(), cell.isDim(), cell.isUnderline(), cell.isBlink(),
    cell.isInverse(), cell.isInvisible(), cell.isStrikethrough(), cell.isOverline(),
  ].map(Number).join(",");
}

function visible(buffer) {
  // Each visible row: its text, and its runs of attributes as [start, end, attributes] (blank default cells
  // at the end of a row are not listed: a row cleared and a row never written look the same).
  const out = [];
  const cell = buffer.getNullCell();
  for (let y = buffer.baseY; y < buffer.baseY + rows; y++) {
    const line = buffer.getLine(y);
    let text = "";
    const runs = [];
    for (let x = 0; x < cols; x++) {
      line.getCell(x, cell);
      if (cell.getWidth() === 0) continue;  // the second half of a wide character
      text += cell.getChars() || " ";
      const sig = attributes(cell);
      const last = runs[runs.length - 1];
      if (last && last[2] === sig && last[1] === x) last[1] = x + 1;
      else runs.push([x, x + 1, sig]);
    }
    const plain = attributes(buffer.getNullCell());
    while (runs.length && runs[runs.length - 1][2] === plain) runs.pop();
    out.push({ text: text.replace(/ +$/, ""), runs, wrapped: line.isWrapped });
  }
  return out;
}

const chunks = [];
process.stdin.on("data", (chunk) => chunks.push(chunk));
process.stdin.on("end", () => {
  term.write(new Uint8Array(Buffer.concat(chunks)), () => {
    const core = term._core;
    const active = term.buffer.active;
    process.stdout.write(JSON.stringify({
      active: active.type,
      cursor: { x: active.cursorX, y: active.cursorY, hidden: Boolean(core.coreService.isCursorHidden) },
      scroll_region: [core.buffer.scrollTop, core.buffer.scrollBottom],
      title,
      modes: term.modes,
      mouse_encoding: core.coreMouseService.activeEncoding,
      normal: visible(term.buffer.normal),
      alternate: active.type === "alternate" ? visible(term.buffer.alternate) : null,
    }));
  });
});

// The terminal's grid (docs/protocol.md, "Grids"): one connection has one grid, so a new one costs a
// reconnect, and a new one is fitted only for a box (or font) that changed. For the same box xterm's
// proposal can alternate between two grids (its DOM renderer's cell width depends on the column count).

const REGRID_DEBOUNCE_MS = 80;

export class GridWatch {
  constructor({ term, fit }) {
    this.term = term;
    this.fit = fit;
    this.fittedBox = null;
    this.timer = null;
  }

  boxSize() {
    const box = this.term.element?.parentElement?.getBoundingClientRect();
    return box ? `${Math.round(box.width)}x${Math.round(box.height)}` : "";
  }

  boxChanged() {
    return this.boxSize() !== this.fittedBox;
  }

  // A resize notice: after a short quiet, `then(force)` when the box changed (or when forced).
  notice(force, then) {
    if (!force && this.fittedBox && !this.boxChanged()) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => then(force), REGRID_DEBOUNCE_MS);
  }

  // The grid xterm proposes for the box now, when it differs from the terminal's; else null (and the box
  // counts as fitted).
  proposedChange() {
    const dims = this.fit.proposeDimensions();
    if (!dims || !(dims.cols > 0 && dims.rows > 0)) return null;
    if (dims.cols === this.term.cols && dims.rows === this.term.rows) {
      this.fittedBox = this.boxSize();
      return null;
    }
    return dims;
  }

  fitNow(force = false) {
    if (!force && this.fittedBox && !this.boxChanged()) return;
    this.fittedBox = this.boxSize();
    if (this.proposedChange()) this.fit.fit();
  }

  stop() {
    clearTimeout(this.timer);
  }
}

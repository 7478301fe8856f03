// The terminal page: xterm.js, its toolbar, and the session client (see docs/protocol.md).

import { FitAddon } from "@xterm/addon-fit";
import { SerializeAddon } from "@xterm/addon-serialize";
import { WebLinksAddon } from "@xterm/addon-web-links";
import { Terminal } from "@xterm/xterm";

import { CommandRail } from "./commands.js";
import { Screen } from "./screen.js";
import { Via } from "./protocol.js";
import { SessionClient } from "./session-client.js";
import { clipboardKeys, installFontSize, installSearch, installTouchKeys } from "./tools.js";

const NOTICE_MS = 10 * 1000;

function bufferText(term) {
  // Whole buffer (scrollback included), joining soft-wrapped rows back into their lines.
  const buffer = term.buffer.active;
  const lines = [];
  for (let i = 0; i < buffer.length; i++) {
    const line = buffer.getLine(i);
    if (!line) continue;
    const text = line.translateToString(true);
    if (line.isWrapped && lines.length) lines[lines.length - 1] += text;
    else lines.push(text);
  }
  while (lines.length && lines[lines.length - 1] === "") lines.pop();
  return lines.join("\n");
}

async function copyToClipboard(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch {
      // Permission refused: fall back to the old way below.
    }
  }
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.style.cssText = "position:fixed;top:0;left:0;opacity:0";
  document.body.append(area);
  area.select();
  let copied = false;
  try {
    copied = document.execCommand("copy");
  } catch {
    copied = false;
  }
  area.remove();
  return copied;
}

class Page {
  constructor(root, term, me) {
    this.term = term;
    this.me = me; // this window's user: not listed as watching its own page
    this.observedGrid = null; // the writer's grid, drawn scaled while this window only watches
    this.fitObserved = true; // scaled to this window's box; false: at its actual size, scrolled
    this.watchersEl = root.querySelector("#terminal-watchers");
    this.status = root.querySelector("#terminal-status");
    this.noticeEl = root.querySelector("#terminal-notice");
    this.commandNoticeEl = root.querySelector("#terminal-command-notice");
    this.commandNoticeTimer = null;
    this.actions = {
      takeover: root.querySelector("#terminal-takeover"),
      "new-shell": root.querySelector("#terminal-new-shell"),
      reopen: root.querySelector("#terminal-reopen"),
      reconnect: root.querySelector("#terminal-reconnect"),
    };
    this.noticeTimer = null;
    this.notices = []; // every notice shown, for the debugging handle below
    this.warningEl = root.querySelector("#terminal-warning");
    this.keepOpenButton = root.querySelector("#terminal-keep-open");
    this.durabilityEl = root.querySelector("#terminal-durability");
    this.gapEl = root.querySelector("#terminal-gap");
    this.gapTextEl = root.querySelector("#terminal-gap-text");
    root.querySelector("#terminal-gap-close").addEventListener("click", () => {
      this.gapEl.hidden = true;
    });
  }

  // Output this page will never see was not kept (a reload or an outage past what the worker keeps): said in
  // a line of its own that stays until dismissed, where the screen's own repaint cannot overwrite it.
  gap(lost, redrawn) {
    const size = lost >= 1024 ? `${Math.round(lost / 1024)} KB` : `${lost} bytes`;
    this.gapTextEl.textContent = redrawn
      ? `Reconnected: the screen is as it is now; ${size} of earlier output are not kept`
      : `Reconnected: ${size} of earlier output are not kept; the screen may be incomplete until the program draws it again`;
    this.gapEl.hidden = false;
  }

  // Said while attached to a shell that no session holder keeps: a restart of Tether's worker ends it.
  durability(why) {
    this.durabilityEl.hidden = !why;
    this.durabilityEl.title = why ? `This shell ends if Tether's worker restarts: ${why}` : "";
  }

  // Who watches this shell read-only besides its writer (the writer sees them; so do the others).
  watchers(list) {
    const names = list
      .filter(({ name, via }) => !(name === this.me && via !== ""))
      .map(({ name, via }) => (via === Via.SHARE_LINK ? `${name} (share link)` : name));
    this.watchersEl.hidden = names.length === 0;
    this.watchersEl.textContent = names.length ? `Watched by ${names.join(", ")}` : "";
    this.watchersEl.dataset.count = String(names.length);
  }

  // An observer draws the writer's grid, scaled down to fit its own box (never reflowed to its own width):
  // drawGrid(cols, rows) sets it, drawGrid() fits it again to a new box, drawGrid(null) gives the grid back.
  drawGrid(cols, rows) {
    const element = this.term.element;
    if (cols === null) {
      this.observedGrid = null;
      element.style.transform = "";
      element.parentElement.style.overflow = "";
      return;
    }
    if (cols !== undefined) this.observedGrid = { cols, rows };
    const grid = this.observedGrid;
    if (!grid) return;
    if (this.term.cols !== grid.cols || this.term.rows !== grid.rows) this.term.resize(grid.cols, grid.rows);
    element.style.transformOrigin = "0 0";
    element.style.transform = "";
    element.parentElement.style.overflow = this.fitObserved ? "" : "auto";
    if (!this.fitObserved) return;
    const box = element.parentElement.getBoundingClientRect();
    const drawn = element.querySelector(".xterm-screen")?.getBoundingClientRect();
    if (!drawn || !drawn.width || !drawn.height) return;
    const scale = Math.min(1, box.width / drawn.width, box.height / drawn.height);
    element.style.transform = scale < 1 ? `scale(${scale})` : "";
  }

  // A standing warning (until cleared with null), unlike a notice that fades.
  warn(text, offerKeepOpen = false) {
    this.warningEl.textContent = text ?? "";
    this.warningEl.hidden = !text;
    this.keepOpenButton.hidden = !(text && offerKeepOpen);
  }

  setStatus(text, tone, phase) {
    this.status.textContent = text;
    this.status.dataset.tone = tone;
    document.body.dataset.phase = phase;
  }

  showActions(names) {
    for (const [name, element] of Object.entries(this.actions)) {
      if (element) element.hidden = !names.includes(name);
    }
  }

  // What became of the last command, told on every attach: in a place of its own, so it never hides a
  // notice of another kind (why keys were dropped) nor is hidden by one.
  commandNotice(text) {
    this.notices.push(text);
    this.commandNoticeEl.textContent = text;
    this.commandNoticeEl.hidden = false;
    clearTimeout(this.commandNoticeTimer);
    this.commandNoticeTimer = setTimeout(() => {
      this.commandNoticeEl.hidden = true;
    }, NOTICE_MS);
  }

  notice(text) {
    this.notices.push(text);
    this.noticeEl.textContent = text;
    this.noticeEl.hidden = false;
    clearTimeout(this.noticeTimer);
    this.noticeTimer = setTimeout(() => {
      this.noticeEl.hidden = true;
    }, NOTICE_MS);
  }
}

// The command rail: open by default on wide windows (set before the first fit, so it costs no regrid; on
// narrower ones it would take too many columns), and as the person last left it.
function installRailToggle(root) {
  const rail = root.querySelector("#terminal-commands");
  const button = root.querySelector("#terminal-commands-toggle");
  let open = window.matchMedia("(min-width: 1280px)").matches;
  try {
    const kept = localStorage.getItem("tether.commandRail");
    if (kept !== null) open = kept === "open";
  } catch {
    // Storage disabled: the default above.
  }
  const show = (value) => {
    rail.hidden = !value;
    button.setAttribute("aria-pressed", String(value));
  };
  show(open);
  button.addEventListener("click", () => {
    show(rail.hidden);
    try {
      localStorage.setItem("tether.commandRail", rail.hidden ? "closed" : "open");
    } catch {
      // Not kept: fine.
    }
  });
}

// The tools fold into a menu (Tools ▾) on a narrow window, and whenever the bar's own words would be cut: the
// workspace's name, the status, or why the shell ended. Measured again as the window or the bar's words change.
function installToolsFold(root) {
  const bar = root.querySelector(".terminal-bar");
  const main = bar.querySelector(".bar-main");
  const tools = bar.querySelector("#terminal-tools");
  const toggle = bar.querySelector("#terminal-tools-toggle");
  const narrow = window.matchMedia("(max-width: 640px)");
  const words = () => [...main.querySelectorAll(".machine-name, .status, .warning, .notice")].filter((el) => !el.hidden);
  const cut = (el) => el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1;
  const open = (value) => {
    tools.classList.toggle("open", value);
    toggle.setAttribute("aria-expanded", String(value));
  };
  let measuring = false;
  const measure = () => {
    if (measuring) return;
    measuring = true;
    const wasFolded = bar.classList.contains("folded");
    bar.classList.remove("folded");
    const fold = narrow.matches || bar.scrollWidth > bar.clientWidth + 1 || cut(main) || words().some(cut);
    bar.classList.toggle("folded", fold);
    toggle.hidden = !fold;
    // Where the tools begin: the bar's words, when they grow over the terminal (an ended shell), stop there.
    bar.style.setProperty("--tools-room", `${bar.clientWidth - tools.parentElement.offsetLeft + 6}px`);
    if (!fold || !wasFolded) open(false);
    measuring = false;
  };
  toggle.addEventListener("click", (event) => {
    event.stopPropagation();
    open(!tools.classList.contains("open"));
  });
  // A tool used, or a click elsewhere: the menu closes.
  tools.addEventListener("click", () => bar.classList.contains("folded") && open(false));
  document.addEventListener("click", (event) => {
    if (!tools.contains(event.target)) open(false);
  });
  document.addEventListener("keydown", (event) => event.key === "Escape" && open(false));
  new ResizeObserver(measure).observe(bar);
  new MutationObserver(measure).observe(main, { subtree: true, childList: true, characterData: true, attributes: true });
  narrow.addEventListener("change", measure);
  measure();
}

// Share: a dialog over the page whose panel (recordings/shares.html) htmx loads and swaps in place.
function installShareDialog(root, config) {
  const button = root.querySelector("#terminal-share");
  const dialog = root.querySelector("#share-dialog");
  if (!button || !dialog || !config.sharesUrl) return;
  const slot = dialog.querySelector("#share-slot");
  button.addEventListener("click", () => {
    // The panel of an earlier opening is stale: a click on it (a Revoke) would race the fresh load and
    // be swapped away unseen. Show "Loading…" until the fresh panel is in.
    slot.replaceChildren(Object.assign(document.createElement("p"), { className: "muted", textContent: "Loading…" }));
    dialog.showModal();
    window.htmx?.ajax("GET", config.sharesUrl, { target: "#share-slot", swap: "innerHTML" });
  });
}

// The first connect fits the grid once the page has settled (fonts measured, layout done).
function settled() {
  return document.fonts.ready.then(() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done))));
}

async function main() {
  const config = JSON.parse(document.getElementById("terminal-state").textContent);
  const root = document.getElementById("terminal-page");
  const container = document.getElementById("terminal");

  const term = new Terminal({
    cursorBlink: true,
    fontFamily: '"DejaVu Sans Mono", "Liberation Mono", Menlo, Consolas, monospace',
    fontSize: config.fontSize || 14,
    // At 1.0 a cell is exactly the font's height and the underscore of DejaVu Sans Mono falls just below
    // it, out of sight on a 1x screen: `my_var__x` read as `my var  x`.
    lineHeight: 1.2,
    scrollback: 5000,
    theme: { background: "#14171c", foreground: "#d8dee9", cursor: "#e5c07b", selectionBackground: "#3b4252" },
  });
  installRailToggle(root);
  installToolsFold(root);
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.loadAddon(new WebLinksAddon());
  term.open(container);
  fit.fit();

  const page = new Page(root, term, config.me);
  const serializer = new SerializeAddon();
  term.loadAddon(serializer);
  const screen = new Screen(term, () => {}, serializer);
  const commands = new CommandRail({
    root,
    term,
    url: config.commandsUrl,
    notice: (text) => page.notice(text),
    told: (text) => page.commandNotice(text),
  });
  const client = new SessionClient({ term, fit, screen, page, config, commands });

  const copyKeys = clipboardKeys(term, async (text) => {
    page.notice((await copyToClipboard(text)) ? "Copied the selection" : "Could not copy");
  });
  term.attachCustomKeyEventHandler((event) => {
    if (event.type === "keydown") client.input.noteKeyPress();
    return copyKeys(event);
  });

  container.addEventListener("paste", () => client.input.noteKeyPress(), true);
  const withTouchKeys = installTouchKeys(term, root, (data) => {
    client.input.noteKeyPress();
    client.input.text(data);
  });
  term.onData((data) => client.input.text(withTouchKeys(data)));
  term.onBinary((data) => client.input.binary(data));
  const search = installSearch(term, root);
  installFontSize(term, root, config, () => client.onContainerResize({ force: true }));
  window.addEventListener("keydown", (event) => {
    if (event.ctrlKey && event.shiftKey && event.key.toLowerCase() === "f") {
      event.preventDefault();
      search.open();
    }
  });

  window.addEventListener("pagehide", () => client.stream.persist());

  const dialog = root.querySelector("#reset-dialog");
  root.querySelector("#terminal-reset")?.addEventListener("click", () => dialog.showModal());
  dialog.addEventListener("close", () => {
    if (dialog.returnValue === "reset") client.reset();
    term.focus();
  });
  root.querySelector("#terminal-copy").addEventListener("click", async () => {
    const selection = term.getSelection();
    const text = selection || bufferText(term);
    const copied = await copyToClipboard(text);
    page.notice(copied ? (selection ? "Copied the selection" : "Copied the whole buffer") : "Could not copy");
    term.focus();
  });
  root.querySelector("#terminal-clear").addEventListener("click", () => {
    term.clear(); // this screen only: the shell and the server's buffer are untouched
    term.focus();
  });
  // Keys go to the terminal right after: a take-over or a fresh shell is for typing into.
  page.actions.takeover.addEventListener("click", () => {
    root.querySelector("#terminal-foreign")?.remove();
    const reset = root.querySelector("#terminal-reset");
    if (reset) reset.hidden = false; // the writer now: resetting is theirs too
    root.querySelector("#terminal-fit")?.remove(); // and the grid is this window's own
    client.takeOver();
    term.focus();
  });
  installShareDialog(root, config);
  const fitButton = root.querySelector("#terminal-fit");
  fitButton?.addEventListener("click", () => {
    page.fitObserved = !page.fitObserved;
    fitButton.setAttribute("aria-pressed", String(page.fitObserved));
    fitButton.textContent = page.fitObserved ? "Fit" : "Actual size";
    page.drawGrid();
  });
  page.actions["new-shell"].addEventListener("click", () => {
    client.startNewShell();
    term.focus();
  });
  page.actions.reconnect.addEventListener("click", () => client.reconnect());
  page.keepOpenButton.addEventListener("click", () => {
    client.keepOpen();
    term.focus();
  });

  // A handle for people debugging in the console, and for the browser tests.
  window.tetherTerminal = {
    term,
    client,
    text: () => bufferText(term),
    notices: () => [...page.notices],
    commands,
    state: () => ({
      phase: client.phase,
      status: client.status,
      generation: client.stream.generation,
      received: screen.received,
      rendered: screen.rendered,
      replaying: client.stream.replay.active,
      droppedKeys: client.input.dropped,
      role: client.role,
      cols: term.cols,
      rows: term.rows,
    }),
  };

  await settled();
  new ResizeObserver(() => client.onContainerResize()).observe(container);
  client.start();
  term.focus();
}

main();

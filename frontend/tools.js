// What people expect of a terminal page beyond the stream: find in the scrollback, a font size that follows
// them, Ctrl+C/Ctrl+V that copy and paste when that is what they mean, and the keys a touch keyboard lacks.

import { SearchAddon } from "@xterm/addon-search";

// --- find in the scrollback ------------------------------------------------------------------------

export function installSearch(term, root) {
  const addon = new SearchAddon();
  term.loadAddon(addon);
  const form = root.querySelector("#terminal-search");
  const input = root.querySelector("#terminal-search-text");
  const tools = root.querySelector(".tools");
  const options = { caseSensitive: false, incremental: false };
  const open = () => {
    form.hidden = false;
    tools.hidden = true; // the bar keeps its height: the search takes the tools' place
    input.select();
    input.focus();
  };
  const close = () => {
    form.hidden = true;
    tools.hidden = false;
    term.clearSelection();
    term.focus();
  };
  const find = (backwards) => {
    if (!input.value) return;
    const found = backwards ? addon.findPrevious(input.value, options) : addon.findNext(input.value, options);
    input.dataset.found = found ? "yes" : "no";
  };
  root.querySelector("#terminal-find").addEventListener("click", open);
  root.querySelector("#terminal-search-previous").addEventListener("click", () => find(true));
  root.querySelector("#terminal-search-close").addEventListener("click", close);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    find(false);
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      event.preventDefault();
      close();
    } else if (event.key === "Enter" && event.shiftKey) {
      event.preventDefault();
      find(true);
    }
  });
  return { open, close };
}

// --- font size, kept per user on the server ----------------------------------------------------------

const FONT_MIN = 8;
const FONT_MAX = 32;

export function installFontSize(term, root, config, onChanged) {
  const csrf = JSON.parse(document.body.getAttribute("hx-headers") || "{}")["X-CSRFToken"];
  let saving = null;
  const set = (size) => {
    const next = Math.min(FONT_MAX, Math.max(FONT_MIN, size));
    if (next === term.options.fontSize) return;
    term.options.fontSize = next;
    onChanged(); // another grid for the same box: regrid
    clearTimeout(saving);
    saving = setTimeout(() => {
      fetch(config.preferencesUrl, {
        method: "POST",
        credentials: "same-origin",
        headers: { "X-CSRFToken": csrf },
        body: new URLSearchParams({ font_size: String(next) }),
      }).catch(() => {}); // not kept this time: the page still shows it
    }, 300);
  };
  root.querySelector("#terminal-smaller").addEventListener("click", () => {
    set(term.options.fontSize - 1);
    term.focus();
  });
  root.querySelector("#terminal-larger").addEventListener("click", () => {
    set(term.options.fontSize + 1);
    term.focus();
  });
  return { set };
}

// --- Ctrl+C copies a selection, Ctrl+V pastes (as VS Code's terminal does) ---------------------------

// Returns whether xterm.js should handle the key itself.
export function clipboardKeys(term, copy) {
  return (event) => {
    if (event.type !== "keydown" || !event.ctrlKey || event.altKey || event.metaKey) return true;
    const key = event.key.toLowerCase();
    if (key === "c" && !event.shiftKey && term.hasSelection()) {
      copy(term.getSelection());
      term.clearSelection();
      event.preventDefault();
      return false; // a copy, not an interrupt
    }
    if (key === "v" && !event.shiftKey) {
      return false; // the browser's own paste follows, into xterm's textarea, which sends it as input
    }
    return true;
  };
}

// --- keys a touch keyboard lacks ---------------------------------------------------------------------

export function controlOf(text) {
  // Ctrl held with a letter (or @[\]^_): the C0 control code, as a terminal sends it.
  if (text.length !== 1) return text;
  const code = text.toUpperCase().charCodeAt(0);
  if (code >= 0x40 && code <= 0x5f) return String.fromCharCode(code - 0x40);
  if (text === " ") return "\x00";
  if (text === "?") return "\x7f";
  return text;
}

export function installTouchKeys(term, root, send) {
  const row = root.querySelector("#touch-keys");
  const ctrl = row.querySelector('[data-key="ctrl"]');
  let armed = false;
  const arm = (on) => {
    armed = on;
    ctrl.setAttribute("aria-pressed", String(on));
  };
  const arrows = { up: "A", down: "B", right: "C", left: "D" };
  const keys = { escape: "\x1b", tab: "\t" };
  row.addEventListener("pointerdown", (event) => event.preventDefault()); // keep the keyboard and the focus
  row.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-key]");
    if (!button) return;
    const key = button.dataset.key;
    if (key === "ctrl") {
      arm(!armed);
    } else if (arrows[key]) {
      // In application cursor mode (vim, less) arrows are ESC O x, else ESC [ x.
      const prefix = term.modes.applicationCursorKeysMode ? "\x1bO" : "\x1b[";
      send(prefix + arrows[key]);
    } else {
      send(keys[key]);
    }
    term.focus();
  });
  // The next key typed while Ctrl is armed becomes its control code.
  return (data) => {
    if (!armed) return data;
    arm(false);
    return controlOf(data);
  };
}

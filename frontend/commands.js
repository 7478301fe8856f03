// The session's typed commands (docs/commands.md): the rail that lists them with how each ended, the jump
// to a command's output, and what became of the last one, said on every (re)attach.
//
// The record is the server's: the list is fetched at each attach and kept current by the `command`
// messages the owner worker sends as the shell's marks arrive. Where a command's output begins on this
// screen is found from the same mark as xterm.js parses it (its `at`, the shell's clock, which the record
// keeps too), so a jump lands on its first line of output while that is still in the scrollback.

const GLYPH = { running: "●", exited: "✓", failed: "✗", unknown: "?" };
// How far along a record is: a command runs, then ends (its outcome unknown until an operator settles it).
const STAGE = { running: 0, unknown: 1, exited: 2 };

function clock(iso) {
  return new Date(iso).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  const minutes = Math.floor(seconds / 60);
  return minutes < 60 ? `${minutes} min ${Math.round(seconds % 60)} s` : `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

// The shell's mark time ("1796151390.835575") and a record's ISO time as one key: microseconds since the epoch.
function markKey(at) {
  const [seconds, fraction = ""] = String(at).split(/[.,]/); // the shell's locale may write a comma
  // Rounded to microseconds, as the record's time was (zsh says nanoseconds).
  const micro = Math.round(Number(`0.${fraction || "0"}`) * 1e6);
  return micro >= 1e6 ? `${BigInt(seconds) + 1n}000000` : `${seconds}${String(micro).padStart(6, "0")}`;
}

function isoKey(iso) {
  const match = /\.(\d+)/.exec(iso);
  const seconds = Math.floor(Date.parse(iso) / 1000);
  return `${seconds}${(match ? match[1] : "").padEnd(6, "0").slice(0, 6)}`;
}

export function nameOf(record) {
  if (record.expired) return "A command (its line removed by retention cleanup)";
  return record.hidden ? "A command kept out of the shell's history" : `\`${record.command}\``;
}

// What became of a command, in a sentence.
export function told(record) {
  const name = nameOf(record);
  if (record.state === "running") return `${name} is still running (started ${clock(record.started_at)})`;
  if (record.state === "exited") {
    const code = record.exit_status;
    const signal = code > 128 && code < 128 + 65 ? ` (the shell's code for signal ${code - 128})` : "";
    return `${name} exited with code ${code}${signal} at ${clock(record.ended_at)}`;
  }
  return `${name}: outcome unknown${record.why ? ` (${record.why})` : ""}`;
}

export class CommandRail {
  constructor({ root, term, url, notice, told }) {
    this.term = term;
    this.url = url;
    this.notice = notice; // a passing remark (a jump that cannot be made)
    this.told = told; // what became of the last command
    this.rail = root.querySelector("#terminal-commands");
    this.list = root.querySelector("#terminal-command-list");
    this.off = root.querySelector("#terminal-commands-off");
    this.records = new Map(); // id -> record
    this.outputAt = new Map(); // mark key -> xterm marker of the line the command's output starts on
    this.tracked = null;
    this.fetching = null;
    this.arriving = new Set(); // per fetch on its way: the records its messages brought meanwhile
    term.parser.registerOscHandler(133, (data) => this.onMark(data));
  }

  // Every C mark xterm.js parses (live or replayed): where that command's output begins on this screen.
  onMark(data) {
    if (!data.startsWith("C;")) return true;
    const at = /(?:^|;)at=([0-9.,]+)/.exec(data);
    if (at) {
      const marker = this.term.registerMarker(0);
      if (marker) {
        const key = markKey(at[1]);
        this.outputAt.get(key)?.dispose();
        this.outputAt.set(key, marker);
        marker.onDispose(() => this.outputAt.get(key) === marker && this.outputAt.delete(key));
      }
    }
    return true; // handled: nothing is drawn for a mark
  }

  // On every attach: the record as the server has it; and, coming back (a load, a reload, a reconnect;
  // not our own reattach for a new grid), what became of the last command.
  async attached({ tell = true } = {}) {
    const last = await this.refresh();
    if (last && tell) this.told(told(last));
  }

  // The list as the server has it. A `command` message that comes while the fetch is on its way may be newer
  // than the list (built before that command ran or ended): it is kept over the list's older word.
  async refresh() {
    if (!this.url) return null; // watching through a share link: the record is not this viewer's to list
    const arrived = new Map();
    this.arriving.add(arrived);
    try {
      const response = await fetch(this.url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) return null;
      const body = await response.json();
      const records = new Map(body.commands.map((record) => [record.id, record]));
      for (const [id, record] of arrived) {
        if (!records.has(id) || STAGE[record.state] > STAGE[records.get(id).state]) records.set(id, record);
      }
      this.records = new Map([...records].sort(([a], [b]) => a - b));
      this.setTracking(body.tracking.tracked, body.tracking.why);
    } catch {
      return null; // offline: the list stays as it was; the next attach fetches again
    } finally {
      this.arriving.delete(arrived);
    }
    this.render();
    return [...this.records.values()].at(-1) ?? null;
  }

  // The shell ended (an exit, or an outcome that became unknown) or the socket closed for good: the commands
  // still open were settled with it, so the list is read again from the record (no attach will follow).
  async ended() {
    await this.refresh();
  }

  onCommand(message) {
    if (message.tracked) this.setTracking(true, "");
    if (message.record) {
      this.records.set(message.record.id, message.record);
      for (const arrived of this.arriving) arrived.set(message.record.id, message.record);
      this.render();
    }
  }

  setTracking(tracked, why) {
    this.tracked = tracked;
    this.off.hidden = tracked;
    this.off.textContent = tracked ? "" : `Commands are not being tracked: ${why}.`;
  }

  render() {
    const items = [...this.records.values()].map((record) => this.item(record));
    this.list.replaceChildren(...items);
    this.list.lastElementChild?.scrollIntoView({ block: "nearest" });
  }

  item(record) {
    const li = document.createElement("li");
    const failed = record.state === "exited" && record.exit_status !== 0;
    li.dataset.state = failed ? "failed" : record.state;
    li.dataset.id = record.id;
    const button = document.createElement("button");
    button.type = "button";
    const glyph = document.createElement("span");
    glyph.className = "glyph";
    glyph.textContent = GLYPH[li.dataset.state];
    const line = document.createElement("code");
    line.textContent = record.expired ? "(removed)" : record.hidden ? "(kept out of history)" : record.command;
    const meta = document.createElement("span");
    meta.className = "meta";
    if (record.state === "running") meta.textContent = `running since ${clock(record.started_at)}`;
    else if (record.state === "exited") meta.textContent = `${failed ? `exit ${record.exit_status} · ` : ""}${duration(record.duration)}`;
    else meta.textContent = record.why ? `outcome unknown: ${record.why}` : "outcome unknown";
    button.append(glyph, line, meta);
    button.title = `${told(record)}\n${record.evidence}`;
    button.addEventListener("click", () => this.jump(record, li));
    li.append(button);
    return li;
  }

  jump(record, li) {
    const marker = this.outputAt.get(isoKey(record.started_at));
    if (!marker || marker.isDisposed) {
      this.notice(`The output of ${nameOf(record)} is no longer in this window's scrollback`);
      return;
    }
    this.term.scrollToLine(Math.max(0, marker.line - 1));
    for (const other of this.list.querySelectorAll("[aria-current]")) other.removeAttribute("aria-current");
    li.setAttribute("aria-current", "true");
  }
}

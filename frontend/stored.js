// Where this tab last was in a session (its generation and rendered offset), so a reload replays only what
// it has not shown. Kept in sessionStorage: per tab, gone with it.

export class StoredPosition {
  constructor(session) {
    this.key = `tether.terminal.${session}`;
  }

  load() {
    try {
      const value = JSON.parse(sessionStorage.getItem(this.key) || "null");
      return value && typeof value === "object" ? value : null;
    } catch {
      return null;
    }
  }

  save(generation, offset) {
    try {
      sessionStorage.setItem(this.key, JSON.stringify({ generation, offset }));
    } catch {
      // Storage full or disabled: a reload then simply replays from the start.
    }
  }
}

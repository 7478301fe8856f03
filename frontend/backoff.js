// Reconnecting with backoff: jittered, doubling from 250 ms to 5 s, given up after two minutes of failing
// (a worker restart plus a lease expiry fits well inside that).

const BACKOFF_FIRST_MS = 250;
const BACKOFF_MAX_MS = 5000;
const GIVE_UP_AFTER_MS = 2 * 60 * 1000;

export class Backoff {
  constructor() {
    this.reset();
  }

  reset() {
    this.attempt = 0;
    this.failingSince = null;
  }

  // The next wait in ms, or null once failing has gone on long enough to give up.
  next() {
    this.failingSince ??= Date.now();
    if (Date.now() - this.failingSince > GIVE_UP_AFTER_MS) return null;
    const base = Math.min(BACKOFF_MAX_MS, BACKOFF_FIRST_MS * 2 ** this.attempt);
    this.attempt += 1;
    return base / 2 + (Math.random() * base) / 2;
  }
}

// One viewer socket at a time (docs/protocol.md): opening it, letting it go (its late events are then
// ignored), sending, and noticing a path that went silent without saying so (not even a pong).

import { CloseCode, ToServer } from "./wire.js";

const PING_EVERY_MS = 20 * 1000;
const SILENCE_LIMIT_MS = 45 * 1000;
const ECHO_SAMPLES_KEPT = 50; // keystroke-echo samples sent with the next ping (the server's histogram)

export class Connection {
  constructor({ path, onFrame, onClose, onSilent }) {
    this.path = path;
    this.onFrame = onFrame;
    this.onClose = onClose;
    this.onSilent = onSilent;
    this.ws = null;
    this.id = 0; // the current socket's number: events of an older one are ignored
    this.lastMessageAt = 0;
    // Keystroke echo as the user feels it: from a key sent to the next output received. Reported with
    // the pings, for the operators' echo-latency histogram (tether_keystroke_echo_seconds).
    this.keySentAt = null;
    this.echoSamples = [];
  }

  get present() {
    return this.ws !== null;
  }

  get open() {
    return this.ws?.readyState === WebSocket.OPEN;
  }

  start() {
    setInterval(() => this.ping(), PING_EVERY_MS);
  }

  connect() {
    const id = ++this.id;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}${this.path}`);
    ws.binaryType = "arraybuffer";
    ws.onmessage = (event) => {
      if (id !== this.id) return;
      this.lastMessageAt = Date.now();
      if (this.keySentAt !== null && typeof event.data !== "string") {
        this.echoSamples.push(Math.round((performance.now() - this.keySentAt) * 1000) / 1000);
        if (this.echoSamples.length > ECHO_SAMPLES_KEPT) this.echoSamples.shift();
        this.keySentAt = null;
      }
      this.onFrame(event.data);
    };
    ws.onclose = (event) => {
      if (id !== this.id) return;
      this.keySentAt = null; // a key whose echo never came is no sample
      this.id += 1; // nothing more from this socket
      this.ws = null;
      this.onClose(event.code);
    };
    this.ws = ws;
    this.lastMessageAt = Date.now();
  }

  // Let go of the current socket; its late events are ignored.
  drop(code = CloseCode.PAGE_LEFT, reason = "") {
    this.id += 1;
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) this.ws.close(code, reason);
    this.ws = null;
  }

  send(message) {
    if (this.open) this.ws.send(JSON.stringify(message));
  }

  sendBytes(bytes) {
    this.keySentAt ??= performance.now();
    this.ws.send(bytes);
  }

  ping() {
    if (!this.open) return;
    if (Date.now() - this.lastMessageAt > SILENCE_LIMIT_MS) this.onSilent();
    else this.send({ type: ToServer.PING, echo_ms: this.echoSamples.splice(0) });
  }
}

// A browser cannot see why a handshake was refused: the page itself says whether we are still welcome.
// "login" (signed out), "gone" (no longer ours to see), or null (welcome, or the network is down).
export async function probeWelcome() {
  try {
    // HEAD: the page's own answer (login, gone, or welcome) without its body, and with no side effect.
    const response = await fetch(location.href, {
      method: "HEAD",
      redirect: "manual",
      cache: "no-store",
      credentials: "same-origin",
    });
    if (response.type === "opaqueredirect") return "login";
    if (response.status === 404) return "gone";
  } catch {
    // The network itself is down: keep backing off.
  }
  return null;
}

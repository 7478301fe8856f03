// The recording page: asciinema-player playing a session's asciicast, and its commands (the recording's
// markers) to jump to. The cast's own `m` events are the player's markers, in the same order as the list.

import { create } from "asciinema-player";

function screenText(root) {
  // The player's terminal as text, one row a line (no trailing blanks): what the tests compare.
  const rows = [...root.querySelectorAll(".ap-term-text .ap-line, .ap-line")];
  const lines = rows.map((row) => row.textContent.replace(/\u00a0/g, " ").replace(/\s+$/, ""));
  while (lines.length && lines[lines.length - 1] === "") lines.pop();
  return lines.join("\n");
}

function main() {
  const config = JSON.parse(document.getElementById("recording-state").textContent);
  const root = document.getElementById("player");
  // No cols/rows here: given, they would replace the recording's own grid and its resizes.
  const player = create({ url: config.castUrl, parser: "asciicast" }, root, {
    fit: "width",
    preload: true,
    terminalFontFamily: '"DejaVu Sans Mono", "Liberation Mono", Menlo, Consolas, monospace',
    theme: "asciinema",
  });
  let ended = false;
  player.addEventListener("ended", () => {
    ended = true;
  });
  player.addEventListener("play", () => {
    ended = false;
  });
  for (const button of document.querySelectorAll("#recording-markers [data-marker]")) {
    button.addEventListener("click", async () => {
      await player.seek({ marker: Number(button.dataset.marker) });
      await player.play();
    });
  }
  // A handle for people debugging in the console, and for the browser tests.
  window.tetherPlayer = {
    player,
    text: () => screenText(root),
    ended: () => ended,
    duration: () => player.getDuration(),
    // The end of the recording as it is drawn there (the final screen).
    toEnd: async () => {
      await player.seek("100%");
    },
  };
}

main();

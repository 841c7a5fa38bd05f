// Where a run's state is shown: a status pill with its exit code and duration (a live timer
// while it runs), and one polite live region that tells a screen reader what changed.
import { formatDuration } from "./format.js";

/** The live region: the page's status changes, spoken once each. */
export class Announcer {
  constructor(region) {
    this.region = region;
    this.pending = null; // sentences said in this frame, spoken together
  }

  say(text) {
    if (this.pending) {
      this.pending.push(text);
      return;
    }
    this.pending = [text];
    // Emptied first so that the same sentence twice is announced twice.
    this.region.textContent = "";
    requestAnimationFrame(() => {
      this.region.textContent = this.pending.join(" ");
      this.pending = null;
    });
  }
}

export class StatusBar {
  /** @param {{status: HTMLElement, exitCode?: HTMLElement, duration: HTMLElement}} parts */
  constructor(parts) {
    this.parts = parts;
    this.timer = null;
  }

  set(status, { exitCode, ms, label } = {}) {
    const { status: pill, exitCode: exit, duration } = this.parts;
    pill.dataset.status = status;
    pill.textContent = label || status.replace("_", " ");
    if (exit) exit.textContent = exitCode === undefined || exitCode === null ? "" : `exit ${exitCode}`;
    duration.textContent = formatDuration(ms);
  }

  /** Count the time since `started` (performance.now()) until stop(). */
  startTimer(started) {
    this.stop();
    this.timer = setInterval(() => {
      this.parts.duration.textContent = formatDuration(performance.now() - started);
    }, 100);
  }

  stop() {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }
}

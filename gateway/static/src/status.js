// Where state is shown: a run's status pill with its exit code and duration (a live timer
// while it runs), the gateway's health in the page's header, and one polite live region that
// tells a screen reader what changed.
import { formatDuration, formatUsage } from "./format.js";

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

  /** `usage`: a finished run's record's, shown beside its time (CPU, peak memory). */
  set(status, { exitCode, ms, label, usage } = {}) {
    const { status: pill, exitCode: exit, duration } = this.parts;
    pill.dataset.status = status;
    pill.textContent = label || status.replace("_", " ");
    if (exit) exit.textContent = exitCode === undefined || exitCode === null ? "" : `exit ${exitCode}`;
    const used = formatUsage(usage);
    duration.textContent = [formatDuration(ms), used].filter(Boolean).join(" · ");
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

// The gateway's health (GET /v1/health), as the page's header shows it. It is public and needs
// no token (with --tokens it says only whether the gateway serves, which is all this needs).
const HEALTH = {
  checking: "checking the gateway…",
  up: "gateway up",
  draining: "gateway draining: it takes no new runs",
  unavailable: "gateway up, its store not answering",
  unreachable: "gateway unreachable",
};
// The WebSocket's states worth showing instead, while they last (an open or a closed socket
// says nothing the health does not).
const SOCKET = {
  connecting: "connecting…",
  failed: "connection refused",
  error: "connection error",
};
const SPOKEN = {
  up: "The gateway is up.",
  draining: "The gateway is draining: it takes no new runs.",
  unavailable: "The gateway's store is not answering.",
  unreachable: "The gateway is unreachable.",
};

/**
 * What the user may still spend (GET /v1/usage), shown in the header only when they have a
 * budget: CPU-seconds left of the rolling hour and day. Asked again after each run.
 */
export class BudgetStatus {
  constructor(element, api) {
    this.element = element;
    this.api = api;
  }

  async refresh() {
    let mine;
    try {
      const answer = await this.api.json("/v1/usage");
      mine = answer.users?.find((entry) => entry.user === answer.you); // an admin gets everyone's
    } catch {
      return; // no answer now: what it showed stays
    }
    const left = [
      ["this hour", mine?.last_hour?.cpu_seconds_left],
      ["today", mine?.last_day?.cpu_seconds_left],
    ].filter(([, value]) => value !== null && value !== undefined);
    this.element.hidden = left.length === 0;
    this.element.textContent = left.length
      ? `CPU left: ${left.map(([when, value]) => `${formatDuration(value * 1000)} ${when}`).join(", ")}`
      : "";
  }
}

export class GatewayStatus {
  /**
   * @param {HTMLElement} node  where the state is shown (`data-state`, `data-health`, its text)
   * @param {Announcer} announcer  told when the health changes (not on the first answer)
   * @param {{interval?: number, retry?: number, timeout?: number}} options  ms between asks
   *   while the gateway is up, and while it is not (to see it back soon), and to wait for one
   */
  constructor(node, announcer, { interval = 10_000, retry = 3_000, timeout = 5_000 } = {}) {
    this.node = node;
    this.announcer = announcer;
    this.interval = interval;
    this.retry = retry;
    this.timeout = timeout;
    this.health = "checking";
    this.socketState = null;
    this.timer = null;
    this.asking = null;
  }

  /** Ask now, then again and again while the page is visible (at once when it shows again). */
  start() {
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible") this.check();
      else clearTimeout(this.timer);
    });
    window.addEventListener("online", () => this.check());
    this.check();
  }

  /** Ask the gateway now (one question at a time); the next one a while after the answer. */
  check() {
    if (this.asking) return this.asking;
    clearTimeout(this.timer);
    this.asking = this.ask().then((health) => {
      this.asking = null;
      this.setHealth(health);
      if (document.visibilityState !== "hidden") {
        this.timer = setTimeout(() => this.check(), health === "up" ? this.interval : this.retry);
      }
    });
    return this.asking;
  }

  async ask() {
    try {
      const response = await fetch("/v1/health", {
        cache: "no-store",
        signal: AbortSignal.timeout(this.timeout),
      });
      const status = (await response.json().catch(() => ({})))?.status;
      if (status === "ok") return "up";
      if (status === "draining") return "draining";
      if (status === "store_unavailable") return "unavailable";
      return "unreachable"; // not a gateway's answer (a proxy's error page)
    } catch {
      return "unreachable";
    }
  }

  setHealth(health) {
    const before = this.health;
    this.health = health;
    this.render();
    if (before !== "checking" && before !== health) this.announcer.say(SPOKEN[health]);
  }

  /** The WebSocket's state (stream.js): shown while it connects or after it failed. */
  socket(state) {
    this.socketState = state;
    this.render();
    // A socket that closed or failed: is the gateway still there?
    if (state === "closed" || state === "failed") this.check();
  }

  render() {
    const socket = SOCKET[this.socketState] && this.health !== "unreachable" ? this.socketState : null;
    this.node.dataset.health = this.health;
    this.node.dataset.state = socket || this.health;
    this.node.textContent = socket ? SOCKET[socket] : HEALTH[this.health];
  }
}

// How numbers and times are written on the page.

/** Under a second in milliseconds (`42 ms`), from a second on in tenths (`1.3 s`), as the CLI. */
export function formatDuration(ms) {
  if (ms === undefined || ms === null || Number.isNaN(ms)) return "";
  if (Math.round(ms) < 1000) return `${Math.round(ms)} ms`;
  if (ms < 59_950) return `${(ms / 1000).toFixed(1)} s`;
  const seconds = Math.round(ms / 1000);
  return `${Math.floor(seconds / 60)} min ${seconds % 60} s`;
}

/** What a run used, as its record's `usage` says: `CPU 812 ms · 85.0 MiB` ("" when unknown). */
export function formatUsage(usage) {
  if (!usage) return "";
  const parts = [];
  if (usage.cpu_ms !== undefined && usage.cpu_ms !== null) parts.push(`CPU ${formatDuration(usage.cpu_ms)}`);
  if (usage.peak_memory_bytes) parts.push(`peak ${formatBytes(usage.peak_memory_bytes)}`);
  return parts.join(" · ");
}

export function formatBytes(n) {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

/** A timestamp (RFC 3339) as a short local date and time; "" when there is none. */
export function formatWhen(stamp) {
  if (!stamp) return "";
  const when = new Date(stamp);
  if (Number.isNaN(when.getTime())) return "";
  const today = new Date();
  const sameDay = when.toDateString() === today.toDateString();
  const time = when.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  return sameDay ? time : `${when.toLocaleDateString([], { month: "short", day: "numeric" })} ${time}`;
}

// Merges change events into one push: it fires once no event arrived for `quietMs`, or `maxDelayMs` after the
// first event of the batch, whichever is first (Istio's PILOT_DEBOUNCE_AFTER / PILOT_DEBOUNCE_MAX: 100 ms / 10 s).

export interface PushRequest {
  /** Config and service keys that changed (`Kind/ns/name`, `Service/host`). */
  readonly updated: ReadonlySet<string>;
  /** Why: counts of event reasons, for logs. */
  readonly reasons: Readonly<Record<string, number>>;
  /** When the first merged event arrived (ms since epoch). */
  readonly start: number;
  /** Number of events merged into this request. */
  readonly events: number;
}

export function pushRequest(updated: string, reason: string, now = Date.now()): PushRequest {
  return { updated: new Set([updated]), reasons: { [reason]: 1 }, start: now, events: 1 };
}

export interface DebounceOptions {
  quietMs: number;
  maxDelayMs: number;
  onFlush: (req: PushRequest) => void;
  now?: () => number;
}

/** Accumulates requests in place: merging a burst of N events must stay O(N), not copy the key set N times. */
class Accumulator {
  readonly updated = new Set<string>();
  readonly reasons: Record<string, number> = {};
  start = Infinity;
  events = 0;

  add(r: PushRequest): void {
    for (const k of r.updated) this.updated.add(k);
    for (const [k, v] of Object.entries(r.reasons)) this.reasons[k] = (this.reasons[k] ?? 0) + v;
    this.start = Math.min(this.start, r.start);
    this.events += r.events;
  }

  request(): PushRequest {
    return { updated: this.updated, reasons: this.reasons, start: this.start, events: this.events };
  }
}

export class Debouncer {
  private pending: Accumulator | undefined;
  private firstAt = 0;
  private lastAt = 0;
  private timer: NodeJS.Timeout | undefined;
  private readonly now: () => number;

  constructor(private readonly opts: DebounceOptions) {
    this.now = opts.now ?? Date.now;
  }

  push(req: PushRequest): void {
    const now = this.now();
    if (!this.pending) {
      this.firstAt = now;
      this.pending = new Accumulator();
    }
    this.lastAt = now;
    this.pending.add(req);
    if (this.opts.quietMs <= 0) return this.flush();
    this.arm();
  }

  /** Sends what is pending now (for shutdown or tests). */
  flush(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    const acc = this.pending;
    this.pending = undefined;
    if (acc) this.opts.onFlush(acc.request());
  }

  close(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.pending = undefined;
  }

  private arm(): void {
    if (this.timer) return; // the running timer re-checks both deadlines when it fires
    const wait = Math.max(
      0,
      Math.min(this.lastAt + this.opts.quietMs, this.firstAt + this.opts.maxDelayMs) - this.now(),
    );
    this.timer = setTimeout(() => this.check(), wait);
    this.timer.unref();
  }

  private check(): void {
    this.timer = undefined;
    if (!this.pending) return;
    const now = this.now();
    if (now - this.lastAt >= this.opts.quietMs || now - this.firstAt >= this.opts.maxDelayMs) return this.flush();
    this.arm();
  }
}

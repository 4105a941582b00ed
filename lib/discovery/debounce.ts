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

export function mergeRequests(a: PushRequest | undefined, b: PushRequest): PushRequest {
  if (!a) return b;
  const reasons: Record<string, number> = { ...a.reasons };
  for (const [k, v] of Object.entries(b.reasons)) reasons[k] = (reasons[k] ?? 0) + v;
  return { updated: new Set([...a.updated, ...b.updated]), reasons, start: Math.min(a.start, b.start), events: a.events + b.events };
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

export class Debouncer {
  private pending: PushRequest | undefined;
  private firstAt = 0;
  private lastAt = 0;
  private timer: NodeJS.Timeout | undefined;
  private readonly now: () => number;

  constructor(private readonly opts: DebounceOptions) {
    this.now = opts.now ?? Date.now;
  }

  push(req: PushRequest): void {
    const now = this.now();
    if (!this.pending) this.firstAt = now;
    this.lastAt = now;
    this.pending = mergeRequests(this.pending, req);
    if (this.opts.quietMs <= 0) return this.flush();
    this.arm();
  }

  /** Sends what is pending now (for shutdown or tests). */
  flush(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    const req = this.pending;
    this.pending = undefined;
    if (req) this.opts.onFlush(req);
  }

  close(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.pending = undefined;
  }

  private arm(): void {
    if (this.timer) return; // the running timer re-checks both deadlines when it fires
    const wait = Math.max(0, Math.min(this.lastAt + this.opts.quietMs, this.firstAt + this.opts.maxDelayMs) - this.now());
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

// Bounds how many connections push at once (Istio's PILOT_PUSH_THROTTLE), so a change reaching many proxies
// does not generate and buffer every response at the same moment. Each connection merges its own pending pushes.

export class PushLimiter {
  private active = 0;
  private readonly waiting: (() => void)[] = [];

  constructor(private readonly limit: number) {}

  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.active >= this.limit) await new Promise<void>((r) => this.waiting.push(r));
    this.active++;
    try {
      return await fn();
    } finally {
      this.active--;
      this.waiting.shift()?.();
    }
  }
}

// The agent's one metrics registry, and the one place where its text is merged with other sources (Envoy's).
//
// Components register gauges and counters whose values are read from their own counters at scrape time
// (prom-client `collect`), so nothing is updated on the hot path. Process and runtime metrics come from
// prom-client's defaults under the `istio_agent_` prefix, which gives the Go agent's `istio_agent_process_*` names.

import { collectDefaultMetrics, Counter, Gauge, Registry } from 'prom-client';

export type { Registry } from 'prom-client';

export const PROMETHEUS_CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8';

export function newRegistry(opts: { defaultMetrics?: boolean } = {}): Registry {
  const registry = new Registry();
  if (opts.defaultMetrics ?? true) collectDefaultMetrics({ register: registry, prefix: 'istio_agent_' });
  return registry;
}

/** A gauge whose value is read at scrape time; `read` returning undefined leaves the series out. */
export function gaugeFrom(registry: Registry, name: string, help: string, read: () => number | undefined): void {
  new Gauge({
    name,
    help,
    registers: [registry],
    collect() {
      const v = read();
      this.reset();
      if (v !== undefined) this.set(v);
    },
  });
}

/** A counter whose running total is kept elsewhere and read at scrape time. */
export function counterFrom(registry: Registry, name: string, help: string, read: () => number): void {
  new Counter({
    name,
    help,
    registers: [registry],
    collect() {
      this.reset();
      const v = read();
      if (v > 0) this.inc(v);
    },
  });
}

/**
 * Registers every numeric field of a counters object under `prefix`: names ending in `_total` are counters, the
 * rest gauges. For components that keep plain counter objects.
 */
export function registerCounters(registry: Registry, prefix: string, help: string, read: () => Record<string, number>): void {
  for (const key of Object.keys(read())) {
    const name = prefix + key;
    if (key.endsWith('_total')) counterFrom(registry, name, `${help}: ${key.replace(/_/g, ' ')}`, () => read()[key] ?? 0);
    else gaugeFrom(registry, name, `${help}: ${key.replace(/_/g, ' ')}`, () => read()[key]);
  }
}

/** Another exposition to append to the agent's (Envoy's 15090 text, the app's): text, or '' when unavailable. */
export interface MetricsSource {
  name: string;
  scrape(): Promise<string>;
}

/** The agent's metrics followed by each source's, in Prometheus text format. A failing source adds nothing. */
export async function mergedMetrics(registry: Registry, sources: readonly MetricsSource[]): Promise<string> {
  const [own, ...others] = await Promise.all([registry.metrics(), ...sources.map((s) => s.scrape().catch(() => ''))]);
  let out = own.endsWith('\n') ? own : own + '\n';
  for (const t of others) if (t) out += t.endsWith('\n') ? t : t + '\n';
  return out;
}

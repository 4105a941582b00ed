// The agent's one metrics registry, and the one place where its text is merged with other sources (Envoy's).
//
// Components register gauges and counters whose values are read from their own counters at scrape time
// (prom-client `collect`), so nothing is updated on the hot path. Process and runtime metrics come from
// prom-client's defaults under the `istio_agent_` prefix, which gives the Go agent's `istio_agent_process_*` names.

import { collectDefaultMetrics, Counter, Gauge, Registry } from './prom';
import { scope } from './log';
import { VERSION } from './version';
import { mergeExpositions, negotiateFormat, type MetricsFormat } from './metrics-merge';

const log = scope('metrics');

export type { Registry } from './prom';

// Registries whose process metrics (CPU, memory, event loop, GC) are set up on their first scrape, not at start-up:
// setting them up is a tenth of the agent's CPU before Envoy is ready, and nothing reads them before a scrape.
const defaultsPending = new WeakSet<Registry>();

function withDefaultMetrics(registry: Registry): Registry {
  if (defaultsPending.delete(registry)) collectDefaultMetrics({ register: registry, prefix: 'istio_agent_' });
  return registry;
}

export function newRegistry(opts: { defaultMetrics?: boolean } = {}): Registry {
  const registry = new Registry();
  if (opts.defaultMetrics ?? true) defaultsPending.add(registry);
  new Gauge({
    name: 'istio_agent_istio_build',
    help: 'Istio component build info',
    labelNames: ['component', 'tag'],
    registers: [registry],
  }).set({ component: 'pilot-agent', tag: VERSION }, 1);
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
export function registerCounters(
  registry: Registry,
  prefix: string,
  help: string,
  read: () => Record<string, number>,
): void {
  for (const key of Object.keys(read())) {
    const name = prefix + key;
    if (key.endsWith('_total'))
      counterFrom(registry, name, `${help}: ${key.replace(/_/g, ' ')}`, () => read()[key] ?? 0);
    else gaugeFrom(registry, name, `${help}: ${key.replace(/_/g, ' ')}`, () => read()[key]);
  }
}

/**
 * Another exposition merged with the agent's: Envoy's 15090 text, the app's. `type` is the `type` label of
 * istio_agent_scrape_failures_total, as the Go agent counts them (envoy, application).
 */
export interface MetricsSource {
  name: string;
  type: 'envoy' | 'application';
  /** The text, or why it could not be had; must give up within its own short deadline. */
  scrape(
    accept: string | undefined,
  ): Promise<{ ok: true; text: string; format?: MetricsFormat } | { ok: false; reason: string }>;
}

/** The merged exposition and its content type, in the format the scraper's Accept header prefers. */
export type MergedScrape = (accept: string | undefined) => Promise<{ body: string; contentType: string }>;

/**
 * The one place where the agent's metrics meet the other sources': each source is scraped in parallel, parsed and
 * merged into one valid exposition (lib/metrics-merge.ts); a source that fails or does not parse is left out, logged
 * and counted, and never delays or breaks the rest.
 */
export function mergedScrape(registry: Registry, sources: readonly MetricsSource[]): MergedScrape {
  const failures = new Counter({
    name: 'istio_agent_scrape_failures_total',
    help: 'Metrics sources that could not be scraped or merged',
    labelNames: ['type'],
    registers: [registry],
  });
  const scrapes = new Counter({
    name: 'istio_agent_scrapes_total',
    help: 'Scrapes of the merged metrics endpoint',
    registers: [registry],
  });
  // The app's families that were Envoy's or the agent's, to warn once each; cleared if it ever grows large.
  const spoofWarned = new Set<string>();
  // One merge in flight per Accept header, shared by every scrape that arrives meanwhile: a flood of concurrent
  // scrapes (any host reaches 15020) costs one fetch of Envoy's stats and one merge, not one each.
  const inFlight = new Map<string, Promise<{ body: string; contentType: string }>>();
  return (accept) => {
    scrapes.inc();
    const key = accept ?? '';
    let p = inFlight.get(key);
    if (!p) {
      p = merge(accept).finally(() => inFlight.delete(key));
      inFlight.set(key, p);
    }
    return p;
  };

  async function merge(accept: string | undefined): Promise<{ body: string; contentType: string }> {
    const format = negotiateFormat(accept);
    const results = await Promise.all(
      sources.map((s) => s.scrape(accept).catch((err: Error) => ({ ok: false as const, reason: err.message }))),
    );
    const texts: Array<{ name: string; text: string; format?: MetricsFormat; untrusted: boolean }> = [];
    results.forEach((r, i) => {
      const src = sources[i]!;
      // The app cannot add to Envoy's or the agent's families (a spoofed envoy_server_live, say).
      if (r.ok) texts.push({ name: src.name, text: r.text, format: r.format, untrusted: src.type === 'application' });
      else {
        failures.inc({ type: src.type });
        log.debug(`metrics from ${src.name} left out: ${r.reason}`);
      }
    });
    const own = await withDefaultMetrics(registry).metrics();
    const merged = mergeExpositions([{ name: 'agent', text: own, format: 'text' }, ...texts], format);
    for (const p of merged.problems) {
      const src = sources.find((s) => s.name === p.source);
      if (src) failures.inc({ type: src.type });
      const once = p.ownedFamily !== undefined && !spoofWarned.has(`${p.source} ${p.ownedFamily}`);
      if (once && spoofWarned.add(`${p.source} ${p.ownedFamily}`).size > 1000) spoofWarned.clear();
      if (once) log.warn(`metrics from ${p.source}: ${p.problem} (logged once per family)`);
      else log.debug(`metrics from ${p.source}: ${p.problem}`);
    }
    return { body: merged.body, contentType: merged.contentType };
  }
}

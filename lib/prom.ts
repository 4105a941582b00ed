// prom-client's metric classes, loaded from its own modules rather than its index: the index also loads its
// Pushgateway (node:https, and with it TLS and the bundled roots), its cluster aggregator (node:cluster) and every
// default metric, which was a tenth of the agent's CPU between Envoy's spawn and the first certificate request.
// Types still come from the package's own declarations; the default metrics load on the first scrape (lib/metrics.ts).

/* eslint-disable @typescript-eslint/no-require-imports */
import type * as prom from 'prom-client';

export const Registry: typeof prom.Registry = require('prom-client/lib/registry');
export type Registry = prom.Registry;
export const Counter: typeof prom.Counter = require('prom-client/lib/counter');
export type Counter<T extends string = string> = prom.Counter<T>;
export const Gauge: typeof prom.Gauge = require('prom-client/lib/gauge');
export type Gauge<T extends string = string> = prom.Gauge<T>;
export const Histogram: typeof prom.Histogram = require('prom-client/lib/histogram');
export type Histogram<T extends string = string> = prom.Histogram<T>;

/** prom-client's process and runtime metrics; loaded when called. */
export function collectDefaultMetrics(config: prom.DefaultMetricsCollectorConfiguration<prom.RegistryContentType>) {
  (require('prom-client/lib/defaultMetrics') as typeof prom.collectDefaultMetrics)(config);
}

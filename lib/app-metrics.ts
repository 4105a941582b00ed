// The app's metrics for the merged /stats/prometheus: ISTIO_PROMETHEUS_ANNOTATIONS (written by the injector from
// the pod's prometheus.io/{scrape,path,port} annotations, or a `targets` list) says where the app serves them.
// A scrape never throws and never waits long: it has a deadline and a size cap (10 MiB, as Istio), and every
// failure (refused, timeout, non-200, too large, not text) comes back as a reason for the log and
// istio_agent_scrape_failures_total{type="application"}. Whether the text is a valid exposition is checked
// when it is merged (lib/metrics-merge.ts).

import type * as httpType from 'node:http';
import type { MetricsSource } from './metrics';
import { configError, errorMessage } from './errors';
import type { Env } from './env';
import * as envs from './env';
import { detectFormat, type MetricsFormat } from './metrics-merge';

// node:http is loaded by the first scrape, not with this module, whose settings are read before Envoy's spawn.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const http = () => require('node:http') as typeof httpType;

export interface ScrapeTarget {
  port: number;
  path: string;
}

export type ScrapeOutcome = { ok: true; text: string; format: MetricsFormat } | { ok: false; reason: string };

const VAR = 'ISTIO_PROMETHEUS_ANNOTATIONS';
export const DEFAULT_MAX_APP_METRICS_BYTES = 10 * 1024 * 1024;

// Ports of the agent and Envoy: scraping them would recurse or count Envoy twice.
const RESERVED: Record<number, string> = {
  15000: 'Envoy admin',
  15001: 'outbound traffic capture',
  15004: 'pilot debug',
  15006: 'inbound traffic capture',
  15008: 'HBONE tunnel',
  15020: "the agent's status port",
  15021: 'Envoy health',
  15053: 'DNS proxy',
  15090: 'Envoy Prometheus (already merged)',
};

/**
 * The app's scrape targets, or none when the variable is unset or `scrape` is "false". As Istio: path defaults to
 * /metrics, port to 80; a port that is the status port or one of Istio's own is a startup error naming the variable.
 */
export function parseAppMetricsConfig(env: Env, statusPort: number): ScrapeTarget[] {
  const text = envs.ISTIO_PROMETHEUS_ANNOTATIONS.get(env).trim();
  if (!text) return [];
  const bad = (problem: string) => configError(VAR, `environment variable ${VAR}`, problem);
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (e) {
    throw bad(`not JSON: ${(e as Error).message}`);
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc))
    throw bad('want a JSON object {scrape, path, port}');
  const o = doc as { scrape?: unknown; path?: unknown; port?: unknown; targets?: unknown };
  if (String(o.scrape ?? '') === 'false') return [];
  const raw: Array<{ port?: unknown; path?: unknown }> =
    Array.isArray(o.targets) && o.targets.length ? o.targets : [{ port: o.port, path: o.path }];
  return raw.map((t, i) => {
    const where = raw.length > 1 || Array.isArray(o.targets) ? `targets[${i}].` : '';
    const portText = t.port === undefined || t.port === null || t.port === '' ? '80' : String(t.port);
    const port = /^\d+$/.test(portText) ? Number(portText) : NaN;
    if (!(port >= 1 && port <= 65535)) throw bad(`${where}port ${JSON.stringify(t.port)} is not a port number`);
    if (port === statusPort) throw bad(`${where}port ${port} is the agent's status port: the scrape would call itself`);
    if (RESERVED[port]) throw bad(`${where}port ${port} is reserved for ${RESERVED[port]}`);
    const path = t.path === undefined || t.path === null || t.path === '' ? '/metrics' : String(t.path);
    return { port, path: path.startsWith('/') ? path : `/${path}` };
  });
}

export interface ScrapeOptions {
  timeoutMs: number;
  maxBytes?: number;
  /** Passed on from the scraper (Istio narrows it to the types an app may answer with). */
  accept?: string;
  userAgent?: string;
  host?: string;
}

/** GET http://localhost:<port><path>; the text, or why not. */
export function scrapeApp(t: ScrapeTarget, o: ScrapeOptions): Promise<ScrapeOutcome> {
  const max = o.maxBytes ?? DEFAULT_MAX_APP_METRICS_BYTES;
  const url = `http://${o.host ?? 'localhost'}:${t.port}${t.path}`;
  return new Promise((resolve) => {
    let done = false;
    const end = (r: ScrapeOutcome) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      req.destroy();
      resolve(r);
    };
    const headers: Record<string, string> = {
      accept: o.accept ?? 'application/openmetrics-text;version=1.0.0;q=0.9,text/plain;version=0.0.4;q=0.8,*/*;q=0.1',
    };
    if (o.userAgent) headers['user-agent'] = o.userAgent;
    headers['x-prometheus-scrape-timeout-seconds'] = String(o.timeoutMs / 1000);
    const req = http().get(url, { headers, agent: false }, (res) => {
      if (res.statusCode !== 200) return end({ ok: false, reason: `${url} answered ${res.statusCode}` });
      const ct = String(res.headers['content-type'] ?? '');
      const declared = Number(res.headers['content-length']);
      if (declared > max)
        return end({ ok: false, reason: `${url} sends ${declared} bytes, more than the ${max} allowed` });
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (c: Buffer) => {
        size += c.length;
        if (size > max) return end({ ok: false, reason: `${url} sent more than the ${max} bytes allowed` });
        chunks.push(c);
      });
      res.on('end', () => {
        const body = Buffer.concat(chunks);
        if (body.includes(0)) return end({ ok: false, reason: `${url} answered binary data, not Prometheus text` });
        const text = body.toString('utf8');
        const format: MetricsFormat = /application\/openmetrics-text/i.test(ct)
          ? 'openmetrics'
          : ct
            ? 'text'
            : detectFormat(text);
        end({ ok: true, text, format });
      });
      res.on('error', (e) => end({ ok: false, reason: `${url}: ${e.message}` }));
    });
    req.on('error', (e) => end({ ok: false, reason: `${url}: ${errorMessage(e)}` }));
    const timer = setTimeout(
      () => end({ ok: false, reason: `${url} did not answer within ${o.timeoutMs} ms` }),
      o.timeoutMs,
    );
    timer.unref();
  });
}

/** The app's scrape targets as sources of the merged /stats/prometheus (short deadline: never slows the scrape). */
export function appMetricsSources(targets: readonly ScrapeTarget[], timeoutMs = 2000): MetricsSource[] {
  return targets.map((t, i) => ({
    name: targets.length > 1 ? `app${i}` : 'app',
    type: 'application' as const,
    scrape: (accept: string | undefined) => scrapeApp(t, { timeoutMs, accept }),
  }));
}

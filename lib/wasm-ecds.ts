// The agent's side of Istio's WasmPlugin: each ECDS response (TypedExtensionConfig) that the xDS proxy gets is
// passed through here before Envoy sees it. A Wasm filter whose module is remote (`http(s)://` or `oci://`) is
// fetched into the Wasm cache and handed to Envoy as a local file; one whose module cannot be had becomes the
// allow-all or deny-all stand-in its failStrategy asks for, so Envoy ACKs it either way (Go: pkg/wasm/convert.go).
// The agent's own settings (ISTIO_META_* in the VM's environment: pull secret, pull policy, resource version)
// never reach Envoy.
//
// A failure is logged once per plugin and reason (again when the reason changes, and when it recovers) and
// counted in Go's istio_agent_wasm_* families. A resource that is not an extension config, or a Wasm filter with
// no code at all, rejects the whole response, which the proxy NACKs upstream as Go does.

import * as path from 'node:path';
import { Counter, Gauge, Histogram, type Registry } from './prom';
import { json, type Component, type StatusRoute } from './component';
import { AgentError, configError, errorMessage } from './errors';
import * as envs from './env';
import { scope } from './log';
import { readExtensionConfig, type ExtensionConfig } from './wasm-config';
import { WasmCache, type WasmCacheOptions } from './wasm-cache';
import { blockList, safeUrl, WasmFetchError } from './wasm-fetch';

export { EXTENSION_CONFIG_TYPE } from './wasm-config';

const log = scope('wasm');

/** Go's HttpUri timeout when the filter has none. */
const DEFAULT_FETCH_DEADLINE_MS = 5_000;
const CONVERSION_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];

type ConversionResult =
  'success' | 'no_remote_load' | 'marshal_failure' | 'unmarshal_failure' | 'fetch_failure' | 'miss_remote_fetch_hint';

/** The cache's settings from the agent's environment (Go: pilot-agent's WASM_* and ISTIO_WASM_* variables). */
export function wasmCacheOptions(
  env: envs.Env,
  configPath: string,
  owner?: WasmCacheOptions['owner'],
): WasmCacheOptions {
  const insecure = envs.WASM_INSECURE_REGISTRIES.get(env)
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  let isBlocked: (a: string) => boolean;
  try {
    isBlocked = blockList(envs.BLOCKED_CIDRS_IN_WASM_FETCH.get(env));
  } catch (e) {
    const v = envs.BLOCKED_CIDRS_IN_WASM_FETCH.name;
    throw configError(v, `environment variable ${v}`, errorMessage(e));
  }
  return {
    dir: path.join(configPath, 'wasm'),
    moduleExpiryMs: envs.WASM_MODULE_EXPIRY.get(env),
    purgeIntervalMs: envs.WASM_PURGE_INTERVAL.get(env),
    httpTimeoutMs: envs.WASM_HTTP_REQUEST_TIMEOUT.get(env),
    httpMaxRetries: envs.WASM_HTTP_REQUEST_MAX_RETRIES.get(env),
    maxBytes: envs.ISTIO_WASM_MAX_BINARY_SIZE_BYTES.get(env),
    insecureRegistries: new Set(insecure),
    isBlocked,
    owner,
  };
}

/** One resource's replacement, as the xDS proxy's rewriter returns it. */
export interface Rewritten {
  name: string;
  any: Buffer;
}

export class WasmEcds implements Component {
  readonly name = 'Wasm cache';
  readonly closed: Promise<Error | undefined>;
  private resolveClosed!: (e: Error | undefined) => void;
  private cacheOrUndefined: WasmCache | undefined;
  private readonly conversions: Record<ConversionResult, number> = {
    success: 0,
    no_remote_load: 0,
    marshal_failure: 0,
    unmarshal_failure: 0,
    fetch_failure: 0,
    miss_remote_fetch_hint: 0,
  };
  private durations: Histogram | undefined;
  /** Per plugin, the failure last logged: the same one again is not. */
  private readonly failing = new Map<string, string>();

  constructor(private readonly opts: WasmCacheOptions) {
    this.closed = new Promise((r) => (this.resolveClosed = r));
  }

  /** Creates the cache directory (removing an earlier run's modules). */
  async start(): Promise<void> {
    try {
      this.cacheOrUndefined ??= new WasmCache(this.opts);
    } catch (e) {
      throw new AgentError('IO', `failed to create the Wasm module cache in ${this.opts.dir}: ${errorMessage(e)}`, e);
    }
    log.debug(`Wasm module cache in ${this.opts.dir}`);
  }

  get cache(): WasmCache {
    if (!this.cacheOrUndefined) throw new AgentError('INTERNAL', 'the Wasm cache is not started');
    return this.cacheOrUndefined;
  }

  /**
   * The xDS proxy's rewriter for TypedExtensionConfig: every resource's Any -> a promise of what Envoy gets (a
   * cached module's resolves at once). All fetches run at once; throws (the proxy NACKs) only for a resource Go
   * would NACK.
   */
  readonly rewrite = (resources: Buffer[]): Array<Promise<Rewritten>> => {
    const started = performance.now();
    const parsed = resources.map((any): ExtensionConfig => {
      try {
        return readExtensionConfig(any);
      } catch (e) {
        this.conversions.unmarshal_failure++;
        throw e;
      }
    });
    const out = parsed.map((c) => this.convert(c));
    void Promise.allSettled(out).then(() => this.durations?.observe(performance.now() - started));
    return out;
  };

  async close(): Promise<void> {
    this.cacheOrUndefined?.close();
    this.resolveClosed(undefined);
  }

  routes(): StatusRoute[] {
    return [{ method: 'GET', path: '/debug/wasm', localOnly: true, handler: () => json(this.debugState()) }];
  }

  private async convert(c: ExtensionConfig): Promise<Rewritten> {
    if (c.kind === 'passthrough') {
      this.conversions.no_remote_load++;
      if (c.why === 'typed_struct')
        this.logFailure(c.name, 'a TypedStruct extension config is passed to Envoy unconverted', 'debug');
      return { name: c.name, any: c.any };
    }
    const w = c.wasm;
    let result: ConversionResult = 'fetch_failure';
    try {
      if (w.url === undefined) {
        result = 'miss_remote_fetch_hint';
        throw new Error(`wasm remote fetch does not have httpUri specified for config ${w.configName}`);
      }
      if (w.pullSecret === '') throw new Error(`missing image pulling secret for ${w.configName}`);
      const file = await this.cache.get(w.url, {
        checksum: w.sha256,
        resourceName: w.resourceName,
        resourceVersion: w.resourceVersion,
        requestTimeoutMs: w.timeoutMs || DEFAULT_FETCH_DEADLINE_MS,
        pullSecret: w.pullSecret === undefined ? undefined : Buffer.from(w.pullSecret, 'utf8'),
        pullPolicy: w.pullPolicy,
      });
      const any = c.withLocalFile(file);
      this.conversions.success++;
      if (this.failing.delete(c.name))
        log.info(`Wasm plugin ${c.name}: module from ${safeUrl(w.url)} fetched, the plugin runs again`);
      return { name: c.name, any };
    } catch (e) {
      this.conversions[result]++;
      const fallback = w.failOpen ? 'allow-all' : 'deny-all';
      const where = w.url === undefined ? '' : ` from ${safeUrl(w.url)}`;
      const why = e instanceof WasmFetchError ? `${e.result}: ${e.message}` : errorMessage(e);
      this.logFailure(
        c.name,
        `cannot fetch the Wasm module${where} (${why}); Envoy gets the ${fallback} stand-in ` +
          `(failStrategy ${w.failOpen ? 'FAIL_OPEN' : 'FAIL_CLOSE'})`,
      );
      return { name: c.name, any: c.standIn() };
    }
  }

  private logFailure(name: string, line: string, level: 'warn' | 'debug' = 'warn'): void {
    if (this.failing.get(name) === line) return log.debug(`Wasm plugin ${name}: ${line}`);
    // A control plane with many plugins that come and go cannot grow this without bound.
    if (this.failing.size >= 10_000) this.failing.clear();
    this.failing.set(name, line);
    log[level](`Wasm plugin ${name}: ${line}`);
  }

  /** Go's istio_agent_wasm_* families (pkg/wasm/monitoring.go), same names, labels and buckets. */
  registerMetrics(registry: Registry): void {
    const self = this;
    const conv = this.conversions;
    new Gauge({
      name: 'istio_agent_wasm_cache_entries',
      help: 'number of Wasm remote fetch cache entries.',
      registers: [registry],
      collect() {
        this.set(self.cacheOrUndefined?.entries ?? 0);
      },
    });
    new Counter({
      name: 'istio_agent_wasm_cache_lookup_count',
      help: 'number of Wasm remote fetch cache lookups.',
      labelNames: ['hit'],
      registers: [registry],
      collect() {
        this.reset();
        const lookups = self.cacheOrUndefined?.counts.lookups;
        for (const hit of ['true', 'false'] as const) if (lookups?.[hit]) this.inc({ hit }, lookups[hit]);
      },
    });
    new Counter({
      name: 'istio_agent_wasm_remote_fetch_count',
      help: 'number of Wasm remote fetches and results, including success, download failure, and checksum mismatch.',
      labelNames: ['result'],
      registers: [registry],
      collect() {
        this.reset();
        for (const [result, n] of Object.entries(self.cacheOrUndefined?.counts.fetches ?? {}))
          if (n) this.inc({ result }, n);
      },
    });
    new Counter({
      name: 'istio_agent_wasm_config_conversion_count',
      help:
        'number of Wasm config conversions and results, including success, no remote load, marshal failure, ' +
        'remote fetch failure, miss remote fetch hint.',
      labelNames: ['result'],
      registers: [registry],
      collect() {
        this.reset();
        for (const [result, n] of Object.entries(conv)) if (n) this.inc({ result }, n);
      },
    });
    this.durations = new Histogram({
      name: 'istio_agent_wasm_config_conversion_duration',
      help: 'Total time in milliseconds istio-agent spends on converting remote load in Wasm config.',
      buckets: CONVERSION_BUCKETS,
      registers: [registry],
    });
  }

  /** For /debug: what the cache holds and which plugins are failing. */
  debugState(): Record<string, unknown> {
    const c = this.cacheOrUndefined;
    return {
      dir: this.opts.dir,
      cacheEntries: c?.entries ?? 0,
      counts: c?.counts,
      conversions: this.conversions,
      failing: Object.fromEntries(this.failing),
    };
  }
}

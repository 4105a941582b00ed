// The meshConfig and ProxyConfig fields tracing depends on, read strictly: `enableTracing`,
// `defaultProviders.tracing` naming an `extensionProviders` entry (zipkin), and ProxyConfig `tracing`
// (`sampling`, `customTags`, `maxPathTagLength`, `enableIstioTags`). The tracer addresses of ProxyConfig
// (`tracing.zipkin.address`, ...) belong to the bootstrap, which builds the `zipkin` cluster from them.

import { AgentError } from '../errors';
import { type Path, Reader, formatPath } from './schema';

export type CustomTag =
  | { literal: { value: string } }
  | { environment: { name: string; defaultValue?: string } }
  | { header: { name: string; defaultValue?: string } };

/** ProxyConfig.tracing, the parts the discovery server uses. */
export interface ProxyTracing {
  sampling?: number;
  maxPathTagLength?: number;
  customTags: Readonly<Record<string, CustomTag>>;
  enableIstioTags?: boolean;
}

/** meshConfig.extensionProviders[].zipkin. */
export interface ZipkinProvider {
  name: string;
  /** `hostname` or `namespace/hostname` of a service in the registry. */
  service: string;
  port: number;
  path?: string;
  maxTagLength?: number;
  enable64bitTraceId?: boolean;
}

export interface MeshTracing {
  enableTracing: boolean;
  /** defaultConfig.tracing: what a proxy that sends no PROXY_CONFIG metadata gets. */
  defaultConfig?: ProxyTracing;
  /** The provider defaultProviders.tracing names (its first entry, as istiod). */
  provider?: ZipkinProvider;
}

/**
 * The tracing fields of a meshConfig document (already parsed YAML), or undefined when it configures none.
 * Throws CONFIG_INVALID naming `source` and the field.
 */
export function readMeshTracing(mesh: unknown, source: string): MeshTracing | undefined {
  if (!mesh || typeof mesh !== 'object' || Array.isArray(mesh)) return undefined;
  const m = mesh as Record<string, unknown>;
  const r = new Reader();
  const enableTracing = r.bool(m.enableTracing, ['enableTracing']) ?? false;
  const dc = r.mapping(m.defaultConfig, ['defaultConfig']);
  const defaultConfig =
    dc?.tracing !== undefined ? readProxyTracing(r, dc.tracing, ['defaultConfig', 'tracing']) : undefined;
  const dp = r.mapping(m.defaultProviders, ['defaultProviders']);
  const names = r
    .array(dp?.tracing, ['defaultProviders', 'tracing'])
    .map((x, i) => r.string(x, ['defaultProviders', 'tracing', i], { required: true }));
  let provider: ZipkinProvider | undefined;
  if (names[0] !== undefined) {
    const list = r.array(m.extensionProviders, ['extensionProviders']);
    const i = list.findIndex((p) => p && typeof p === 'object' && (p as Record<string, unknown>).name === names[0]);
    if (i < 0) r.fail(['defaultProviders', 'tracing', 0], `names no entry of extensionProviders ("${names[0]}")`);
    else provider = readProvider(r, list[i], ['extensionProviders', i]);
  }
  if (r.problems.length) {
    throw new AgentError(
      'CONFIG_INVALID',
      `${source}: ${r.problems.map((p) => `${formatPath(p.path)}: ${p.message}`).join('; ')}`,
    );
  }
  if (!enableTracing && !provider) return undefined;
  return { enableTracing, ...(defaultConfig && { defaultConfig }), ...(provider && { provider }) };
}

/** A proxy's ProxyConfig.tracing from its PROXY_CONFIG metadata (already validated by its agent: problems are dropped). */
export function proxyTracingFromMetadata(v: unknown): ProxyTracing | undefined {
  if (v === undefined || v === null) return undefined;
  const r = new Reader();
  return readProxyTracing(r, v, ['tracing'], true);
}

const TRACERS = ['zipkin', 'datadog', 'lightstep', 'stackdriver', 'openCensusAgent', 'tlsSettings'];

function readProxyTracing(r: Reader, v: unknown, path: Path, lenient = false): ProxyTracing | undefined {
  const o = lenient
    ? r.mapping(v, path)
    : r.object(v, path, ['sampling', 'customTags', 'maxPathTagLength', 'enableIstioTags', ...TRACERS]);
  if (!o) return undefined;
  const out: ProxyTracing = { customTags: {} };
  if (o.sampling !== undefined) {
    if (typeof o.sampling !== 'number' || o.sampling < 0)
      r.fail([...path, 'sampling'], 'must be a percentage from 0 to 100');
    else out.sampling = o.sampling;
  }
  const len = r.int(o.maxPathTagLength, [...path, 'maxPathTagLength'], { min: 0 });
  if (len !== undefined) out.maxPathTagLength = len;
  const tags = r.mapping(o.customTags, [...path, 'customTags']) ?? {};
  const customTags: Record<string, CustomTag> = {};
  for (const [name, t] of Object.entries(tags)) {
    const tp = [...path, 'customTags', name];
    const to = r.object(t, tp, ['literal', 'environment', 'header']);
    if (!to) continue;
    const kinds = Object.keys(to);
    if (kinds.length !== 1) {
      r.fail(tp, 'needs exactly one of literal, environment, header');
      continue;
    }
    if (to.literal !== undefined) {
      const lo = r.object(to.literal, [...tp, 'literal'], ['value']);
      const value = r.string(lo?.value, [...tp, 'literal', 'value'], { required: true });
      if (value !== undefined) customTags[name] = { literal: { value } };
    } else {
      const k = kinds[0] as 'environment' | 'header';
      const eo = r.object(to[k], [...tp, k], ['name', 'defaultValue'], ['name']);
      const n = r.string(eo?.name, [...tp, k, 'name'], { required: true });
      const d = r.string(eo?.defaultValue, [...tp, k, 'defaultValue']);
      if (n !== undefined)
        customTags[name] = { [k]: d === undefined ? { name: n } : { name: n, defaultValue: d } } as CustomTag;
    }
  }
  out.customTags = customTags;
  const eit = r.bool(o.enableIstioTags, [...path, 'enableIstioTags']);
  if (eit !== undefined) out.enableIstioTags = eit;
  return out;
}

function readProvider(r: Reader, v: unknown, path: Path): ZipkinProvider | undefined {
  const o = r.mapping(v, path);
  if (!o) return undefined;
  const kinds = Object.keys(o).filter((k) => k !== 'name');
  if (kinds.length !== 1 || kinds[0] !== 'zipkin') {
    return r.fail(
      path,
      `tracing provider ${kinds.map((k) => `"${k}"`).join(', ')} is not supported by the standalone discovery server (supported: zipkin)`,
    );
  }
  const zp = [...path, 'zipkin'];
  const z = r.object(
    o.zipkin,
    zp,
    ['service', 'port', 'path', 'maxTagLength', 'enable64bitTraceId'],
    ['service', 'port'],
  );
  if (!z) return undefined;
  const service = r.string(z.service, [...zp, 'service'], { required: true });
  const port = r.port(z.port, [...zp, 'port'], true);
  if (service === undefined || port === undefined) return undefined;
  const out: ZipkinProvider = { name: String(o.name), service, port };
  const p = r.string(z.path, [...zp, 'path'], { pattern: /^\//, patternText: 'a path starting with /' });
  if (p !== undefined) out.path = p;
  const mtl = r.int(z.maxTagLength, [...zp, 'maxTagLength'], { min: 0 });
  if (mtl !== undefined) out.maxTagLength = mtl;
  const e64 = r.bool(z.enable64bitTraceId, [...zp, 'enable64bitTraceId']);
  if (e64 !== undefined) out.enable64bitTraceId = e64;
  return out;
}

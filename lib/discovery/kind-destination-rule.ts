// DestinationRule reader: subsets by label and traffic policies (load balancer, connection pool, outlier detection).

import type { DestinationRuleSpec, Subset, TrafficPolicy } from './model';
import { HOST, type Path, type Reader } from './schema';

export function readDestinationRule(r: Reader, v: unknown, path: Path): DestinationRuleSpec | undefined {
  const o = r.object(v, path, ['host', 'trafficPolicy', 'subsets', 'exportTo'], ['host']);
  if (!o) return undefined;
  if (o.exportTo !== undefined) {
    const ex = r.array(o.exportTo, [...path, 'exportTo']);
    if (!(ex.length === 1 && ex[0] === '*')) r.fail([...path, 'exportTo'], 'only ["*"] is supported (every config is visible to every proxy)');
  }
  const host = r.string(o.host, [...path, 'host'], { required: true, pattern: HOST, patternText: 'a hostname' });
  if (host?.includes('*')) r.fail([...path, 'host'], 'wildcard hosts are not supported in a DestinationRule');
  const trafficPolicy = readTrafficPolicy(r, o.trafficPolicy, [...path, 'trafficPolicy']);
  const subsets: Subset[] = [];
  r.array(o.subsets, [...path, 'subsets']).forEach((s, i) => {
    const sp = [...path, 'subsets', i];
    const so = r.object(s, sp, ['name', 'labels', 'trafficPolicy'], ['name']);
    if (!so) return;
    const name = r.string(so.name, [...sp, 'name'], { required: true, pattern: /^[A-Za-z0-9_.-]+$/, patternText: 'a subset name (letters, digits, _ . -)' });
    const labels = r.stringMap(so.labels, [...sp, 'labels']);
    const tp = readTrafficPolicy(r, so.trafficPolicy, [...sp, 'trafficPolicy']);
    if (name === undefined) return;
    if (subsets.some((x) => x.name === name)) r.fail([...sp, 'name'], `subset "${name}" is defined twice`);
    subsets.push(tp ? { name, labels, trafficPolicy: tp } : { name, labels });
  });
  if (host === undefined) return undefined;
  const out: DestinationRuleSpec = { host, subsets };
  if (trafficPolicy) out.trafficPolicy = trafficPolicy;
  return out;
}

function readTrafficPolicy(r: Reader, v: unknown, path: Path): TrafficPolicy | undefined {
  const o = r.object(v, path, ['loadBalancer', 'connectionPool', 'outlierDetection', 'tls']);
  if (!o) return undefined;
  const out: TrafficPolicy = {};
  const tls = r.object(o.tls, [...path, 'tls'], ['mode', 'subjectAltNames'], ['mode']);
  if (tls) {
    const mode = r.oneOf(tls.mode, [...path, 'tls', 'mode'], ['DISABLE', 'ISTIO_MUTUAL'] as const, { required: true, unsupported: ['SIMPLE', 'MUTUAL'] });
    const sans = r.array(tls.subjectAltNames, [...path, 'tls', 'subjectAltNames']).map((s, i) => r.string(s, [...path, 'tls', 'subjectAltNames', i], { required: true }));
    if (mode) out.tls = { mode, subjectAltNames: sans.filter((s): s is string => !!s) };
  }
  const lb = r.object(o.loadBalancer, [...path, 'loadBalancer'], ['simple'], ['simple']);
  if (lb) {
    const simple = r.oneOf(lb.simple, [...path, 'loadBalancer', 'simple'], ['ROUND_ROBIN', 'LEAST_REQUEST', 'RANDOM'] as const, { required: true, unsupported: ['PASSTHROUGH', 'LEAST_CONN', 'UNSPECIFIED'] });
    if (simple) out.loadBalancer = simple;
  }
  const cp = r.object(o.connectionPool, [...path, 'connectionPool'], ['tcp', 'http']);
  if (cp) {
    out.connectionPool = {};
    const tcp = r.object(cp.tcp, [...path, 'connectionPool', 'tcp'], ['maxConnections', 'connectTimeout']);
    if (tcp) {
      out.connectionPool.tcp = clean({
        maxConnections: r.int(tcp.maxConnections, [...path, 'connectionPool', 'tcp', 'maxConnections'], { min: 1 }),
        connectTimeoutMs: r.duration(tcp.connectTimeout, [...path, 'connectionPool', 'tcp', 'connectTimeout']),
      });
    }
    const hp = [...path, 'connectionPool', 'http'];
    const http = r.object(cp.http, hp, ['http1MaxPendingRequests', 'http2MaxRequests', 'maxRequestsPerConnection', 'maxRetries']);
    if (http) {
      out.connectionPool.http = clean({
        http1MaxPendingRequests: r.int(http.http1MaxPendingRequests, [...hp, 'http1MaxPendingRequests'], { min: 1 }),
        http2MaxRequests: r.int(http.http2MaxRequests, [...hp, 'http2MaxRequests'], { min: 1 }),
        maxRequestsPerConnection: r.int(http.maxRequestsPerConnection, [...hp, 'maxRequestsPerConnection'], { min: 0 }),
        maxRetries: r.int(http.maxRetries, [...hp, 'maxRetries'], { min: 0 }),
      });
    }
  }
  const op = [...path, 'outlierDetection'];
  const od = r.object(o.outlierDetection, op, ['consecutive5xxErrors', 'consecutiveGatewayErrors', 'interval', 'baseEjectionTime', 'maxEjectionPercent']);
  if (od) {
    out.outlierDetection = clean({
      consecutive5xxErrors: r.int(od.consecutive5xxErrors, [...op, 'consecutive5xxErrors'], { min: 0 }),
      consecutiveGatewayErrors: r.int(od.consecutiveGatewayErrors, [...op, 'consecutiveGatewayErrors'], { min: 0 }),
      intervalMs: r.duration(od.interval, [...op, 'interval']),
      baseEjectionTimeMs: r.duration(od.baseEjectionTime, [...op, 'baseEjectionTime']),
      maxEjectionPercent: r.int(od.maxEjectionPercent, [...op, 'maxEjectionPercent'], { min: 0, max: 100 }),
    });
  }
  return out;
}

function clean<T extends object>(o: T): T {
  for (const k of Object.keys(o) as (keyof T)[]) if (o[k] === undefined) delete o[k];
  return o;
}

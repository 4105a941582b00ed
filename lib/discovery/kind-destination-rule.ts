// DestinationRule reader: subsets by label and traffic policies (load balancer, connection pool, outlier detection).

import type { ConsistentHash, DestinationRuleSpec, Subset, TrafficPolicy } from './model';
import { readExportTo } from './visibility';
import { HOST, type Path, type Reader } from './schema';
import { readClientTls } from './kind-tls';

export function readDestinationRule(r: Reader, v: unknown, path: Path): DestinationRuleSpec | undefined {
  const o = r.object(v, path, ['host', 'trafficPolicy', 'subsets', 'exportTo'], ['host']);
  if (!o) return undefined;
  const exportTo = readExportTo(r, o.exportTo, [...path, 'exportTo']);
  const host = r.string(o.host, [...path, 'host'], { required: true, pattern: HOST, patternText: 'a hostname' });
  const trafficPolicy = readTrafficPolicy(r, o.trafficPolicy, [...path, 'trafficPolicy']);
  const subsets: Subset[] = [];
  r.array(o.subsets, [...path, 'subsets']).forEach((s, i) => {
    const sp = [...path, 'subsets', i];
    const so = r.object(s, sp, ['name', 'labels', 'trafficPolicy'], ['name']);
    if (!so) return;
    const name = r.string(so.name, [...sp, 'name'], {
      required: true,
      pattern: /^[A-Za-z0-9_.-]+$/,
      patternText: 'a subset name (letters, digits, _ . -)',
    });
    const labels = r.stringMap(so.labels, [...sp, 'labels']);
    const tp = readTrafficPolicy(r, so.trafficPolicy, [...sp, 'trafficPolicy']);
    if (name === undefined) return;
    if (subsets.some((x) => x.name === name)) r.fail([...sp, 'name'], `subset "${name}" is defined twice`);
    subsets.push(tp ? { name, labels, trafficPolicy: tp } : { name, labels });
  });
  if (host === undefined) return undefined;
  const out: DestinationRuleSpec = { host, subsets };
  if (exportTo) out.exportTo = exportTo;
  if (trafficPolicy) out.trafficPolicy = trafficPolicy;
  return out;
}

function readTrafficPolicy(r: Reader, v: unknown, path: Path, portLevel = false): TrafficPolicy | undefined {
  const o = r.object(
    v,
    path,
    portLevel
      ? ['port', 'loadBalancer', 'connectionPool', 'outlierDetection', 'tls']
      : ['loadBalancer', 'connectionPool', 'outlierDetection', 'portLevelSettings', 'tls'],
  );
  if (!o) return undefined;
  const out: TrafficPolicy = {};
  if (!portLevel && o.portLevelSettings !== undefined) {
    const seen = new Set<number>();
    const levels: NonNullable<TrafficPolicy['portLevelSettings']> = [];
    r.array(o.portLevelSettings, [...path, 'portLevelSettings']).forEach((pl, i) => {
      const pp = [...path, 'portLevelSettings', i];
      const po = r.object((pl as Record<string, unknown> | undefined)?.port, [...pp, 'port'], ['number'], ['number']);
      const port = r.port(po?.number, [...pp, 'port', 'number'], true);
      const policy = readTrafficPolicy(r, pl, pp, true);
      if (port === undefined || !policy) return;
      if (seen.has(port)) r.fail([...pp, 'port', 'number'], `port ${port} has settings already`);
      seen.add(port);
      levels.push({ port, policy });
    });
    out.portLevelSettings = levels;
  }
  const tls = readClientTls(r, o.tls, [...path, 'tls']);
  if (tls) out.tls = tls;
  const lp = [...path, 'loadBalancer'];
  const lb = r.object(o.loadBalancer, lp, ['simple', 'consistentHash', 'warmupDurationSecs']);
  if (lb) {
    if (lb.simple !== undefined && lb.consistentHash !== undefined)
      r.fail(lp, 'simple and consistentHash are exclusive');
    if (lb.simple === undefined && lb.consistentHash === undefined && lb.warmupDurationSecs === undefined)
      r.fail(lp, 'needs simple, consistentHash or warmupDurationSecs');
    const warmup = r.duration(lb.warmupDurationSecs, [...lp, 'warmupDurationSecs']);
    if (warmup !== undefined) out.warmupMs = warmup;
    const simple = r.oneOf(lb.simple, [...lp, 'simple'], ['ROUND_ROBIN', 'LEAST_REQUEST', 'RANDOM'] as const, {
      unsupported: ['PASSTHROUGH', 'LEAST_CONN', 'UNSPECIFIED'],
    });
    if (simple) out.loadBalancer = simple;
    const ch = readConsistentHash(r, lb.consistentHash, [...lp, 'consistentHash']);
    if (ch) out.consistentHash = ch;
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
    const http = r.object(cp.http, hp, [
      'http1MaxPendingRequests',
      'http2MaxRequests',
      'maxRequestsPerConnection',
      'maxRetries',
    ]);
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
  const od = r.object(o.outlierDetection, op, [
    'consecutive5xxErrors',
    'consecutiveGatewayErrors',
    'interval',
    'baseEjectionTime',
    'maxEjectionPercent',
  ]);
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

function readConsistentHash(r: Reader, v: unknown, path: Path): ConsistentHash | undefined {
  const keys = ['httpHeaderName', 'httpCookie', 'useSourceIp', 'httpQueryParameterName'];
  const o = r.object(v, path, [...keys, 'ringHash', 'maglev', 'minimumRingSize']);
  if (!o) return undefined;
  const given = keys.filter((k) => o[k] !== undefined);
  if (given.length !== 1) return r.fail(path, `needs exactly one of ${keys.join(', ')}`);
  let key: ConsistentHash['key'] | undefined;
  if (o.httpHeaderName !== undefined) {
    const h = r.string(o.httpHeaderName, [...path, 'httpHeaderName'], { required: true });
    if (h !== undefined) key = { httpHeaderName: h };
  } else if (o.httpQueryParameterName !== undefined) {
    const q = r.string(o.httpQueryParameterName, [...path, 'httpQueryParameterName'], { required: true });
    if (q !== undefined) key = { httpQueryParameterName: q };
  } else if (o.useSourceIp !== undefined) {
    if (r.bool(o.useSourceIp, [...path, 'useSourceIp']) !== true)
      return r.fail([...path, 'useSourceIp'], 'must be true when given');
    key = { useSourceIp: true };
  } else {
    const cp = [...path, 'httpCookie'];
    const c = r.object(o.httpCookie, cp, ['name', 'path', 'ttl'], ['name']);
    const name = r.string(c?.name, [...cp, 'name'], { required: true });
    const cpath = r.string(c?.path, [...cp, 'path']);
    const ttl = r.duration(c?.ttl, [...cp, 'ttl']);
    if (name !== undefined) key = { httpCookie: clean({ name, path: cpath, ttlMs: ttl }) };
  }
  if (o.ringHash !== undefined && o.maglev !== undefined) r.fail(path, 'ringHash and maglev are exclusive');
  const ring = r.object(o.ringHash, [...path, 'ringHash'], ['minimumRingSize']);
  const mag = r.object(o.maglev, [...path, 'maglev'], ['tableSize']);
  const tableSize = r.int(mag?.tableSize, [...path, 'maglev', 'tableSize'], { min: 1, max: 5000011 });
  if (tableSize !== undefined && !isPrime(tableSize))
    r.fail([...path, 'maglev', 'tableSize'], `${tableSize} is not a prime number (Envoy requires one)`);
  const min = r.int(ring?.minimumRingSize ?? o.minimumRingSize, [...path, ring ? 'ringHash' : 'minimumRingSize'], {
    min: 1,
  });
  if (!key) return undefined;
  const out: ConsistentHash = { key, maglev: mag !== undefined };
  if (tableSize) out.maglevTableSize = tableSize;
  if (min !== undefined) out.minimumRingSize = min;
  return out;
}

function isPrime(n: number): boolean {
  if (n < 2) return false;
  for (let i = 2; i * i <= n; i++) if (n % i === 0) return false;
  return true;
}

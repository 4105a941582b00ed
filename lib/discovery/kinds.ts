// The accepted subset of Istio's networking API, in its own apiVersion/kind/metadata/spec form: each reader turns
// one parsed YAML document into a normalised Config, or reports what is wrong and where. Anything outside the
// subset is rejected with a message rather than ignored, so a user never believes a field took effect.

import * as net from 'node:net';
import type {
  Config, DestinationRuleSpec, GatewayServer, GatewaySpec, HttpMatch, HttpRoute, Kind, Protocol, RouteDestination,
  ServiceEntrySpec, ServicePort, StringMatch, Subset, TrafficPolicy, VirtualServiceSpec, WorkloadEntrySpec,
} from './model';
import { KINDS } from './model';
import { DNS_LABEL, DNS_NAME, HOST, type Path, type Problem, Reader } from './schema';

const API_VERSIONS = ['networking.istio.io/v1', 'networking.istio.io/v1beta1', 'networking.istio.io/v1alpha3'];

export interface ReadResult {
  config?: Config;
  problems: Problem[];
}

/** Reads one document. The config is returned only when there is no problem at all. */
export function readDocument(doc: unknown): ReadResult {
  const r = new Reader();
  const top = r.object(doc, [], ['apiVersion', 'kind', 'metadata', 'spec'], ['apiVersion', 'kind', 'metadata', 'spec']);
  if (!top) return { problems: r.problems.length ? r.problems : [{ path: [], message: 'document is empty' }] };
  const kindText = r.string(top.kind, ['kind'], { required: true });
  if (kindText !== undefined && !(KINDS as readonly string[]).includes(kindText)) {
    r.fail(['kind'], `unknown or unsupported kind "${kindText}" (supported: ${KINDS.join(', ')})`);
  }
  const api = r.string(top.apiVersion, ['apiVersion'], { required: true });
  if (api !== undefined && !API_VERSIONS.includes(api)) r.fail(['apiVersion'], `"${api}" is not one of ${API_VERSIONS.join(', ')}`);
  const md = r.object(top.metadata, ['metadata'], ['name', 'namespace', 'labels', 'annotations', 'resourceVersion', 'uid', 'generation', 'creationTimestamp'], ['name']);
  const name = r.string(md?.name, ['metadata', 'name'], { required: true, pattern: DNS_NAME, patternText: 'a lowercase DNS name' });
  const namespace = r.string(md?.namespace, ['metadata', 'namespace'], { pattern: DNS_LABEL, patternText: 'a lowercase DNS label' }) ?? 'default';
  const labels = r.stringMap(md?.labels, ['metadata', 'labels']);
  r.stringMap(md?.annotations, ['metadata', 'annotations']);
  if (!kindText || !(KINDS as readonly string[]).includes(kindText)) return { problems: r.problems };
  const kind = kindText as Kind;
  const spec = SPEC_READERS[kind](r, top.spec, ['spec'], namespace);
  if (r.problems.length || !name || spec === undefined) return { problems: r.problems };
  return { config: { meta: { kind, name, namespace, labels, resourceVersion: '' }, spec }, problems: [] };
}

type SpecReader = (r: Reader, v: unknown, path: Path, namespace: string) => Config['spec'] | undefined;

const SPEC_READERS: Record<Kind, SpecReader> = {
  ServiceEntry: readServiceEntry,
  WorkloadEntry: (r, v, path) => readWorkload(r, v, path, 'STATIC', true),
  VirtualService: readVirtualService,
  DestinationRule: readDestinationRule,
  Gateway: readGateway,
};

const PROTOCOLS: readonly Protocol[] = ['HTTP', 'HTTP2', 'GRPC', 'TCP'];
const UNSUPPORTED_PROTOCOLS = ['HTTPS', 'TLS', 'MONGO', 'REDIS', 'MYSQL', 'UDP', 'GRPC-WEB'];

function readServiceEntry(r: Reader, v: unknown, path: Path): ServiceEntrySpec | undefined {
  const o = r.object(v, path, ['hosts', 'ports', 'resolution', 'location', 'endpoints', 'workloadSelector'], ['hosts', 'ports']);
  if (!o) return undefined;
  const hosts = readHosts(r, o.hosts, [...path, 'hosts'], false);
  const ports: ServicePort[] = [];
  r.array(o.ports, [...path, 'ports'], { required: true, nonEmpty: true }).forEach((p, i) => {
    const pp = [...path, 'ports', i];
    const po = r.object(p, pp, ['number', 'name', 'protocol', 'targetPort'], ['number', 'name']);
    if (!po) return;
    const number = r.port(po.number, [...pp, 'number'], true);
    const name = r.string(po.name, [...pp, 'name'], { required: true });
    const protocol = r.oneOf(po.protocol, [...pp, 'protocol'], PROTOCOLS, { unsupported: UNSUPPORTED_PROTOCOLS }) ?? 'HTTP';
    const targetPort = r.port(po.targetPort, [...pp, 'targetPort']);
    if (number === undefined || name === undefined) return;
    if (ports.some((x) => x.number === number)) r.fail([...pp, 'number'], `port ${number} is listed twice`);
    if (ports.some((x) => x.name === name)) r.fail([...pp, 'name'], `port name "${name}" is listed twice`);
    ports.push(targetPort === undefined ? { number, name, protocol } : { number, name, protocol, targetPort });
  });
  const resolution = r.oneOf(o.resolution, [...path, 'resolution'], ['STATIC', 'DNS'] as const, { unsupported: ['NONE', 'DNS_ROUND_ROBIN'] }) ?? 'STATIC';
  const location = r.oneOf(o.location, [...path, 'location'], ['MESH_EXTERNAL', 'MESH_INTERNAL'] as const) ?? 'MESH_EXTERNAL';
  const endpoints: WorkloadEntrySpec[] = [];
  r.array(o.endpoints, [...path, 'endpoints']).forEach((e, i) => {
    const ep = readWorkload(r, e, [...path, 'endpoints', i], resolution, false);
    if (!ep) return;
    for (const pn of Object.keys(ep.ports)) {
      if (!ports.some((p) => p.name === pn)) r.fail([...path, 'endpoints', i, 'ports', pn], `names no port of this ServiceEntry (ports: ${ports.map((p) => p.name).join(', ')})`);
    }
    endpoints.push(ep);
  });
  let workloadSelector: Record<string, string> | undefined;
  if (o.workloadSelector !== undefined) {
    const ws = r.object(o.workloadSelector, [...path, 'workloadSelector'], ['labels'], ['labels']);
    workloadSelector = r.stringMap(ws?.labels, [...path, 'workloadSelector', 'labels']);
    if (endpoints.length) r.fail([...path, 'workloadSelector'], 'cannot be combined with endpoints');
  }
  if (resolution === 'STATIC' && !endpoints.length && !workloadSelector) {
    r.fail([...path, 'endpoints'], 'resolution STATIC needs endpoints or a workloadSelector');
  }
  if (hosts.some((h) => h.includes('*'))) r.fail([...path, 'hosts'], 'wildcard hosts are not supported in a ServiceEntry');
  const out: ServiceEntrySpec = { hosts, ports, resolution, location, endpoints };
  if (workloadSelector) out.workloadSelector = workloadSelector;
  return out;
}

function readWorkload(r: Reader, v: unknown, path: Path, resolution: 'STATIC' | 'DNS', standalone: boolean): WorkloadEntrySpec | undefined {
  const allowed = ['address', 'ports', 'labels', 'weight', 'network', 'locality', 'serviceAccount'];
  const o = r.object(v, path, allowed, ['address']);
  if (!o) return undefined;
  for (const f of ['network', 'locality', 'serviceAccount']) r.string(o[f], [...path, f]);
  const address = r.string(o.address, [...path, 'address'], { required: true });
  if (address !== undefined) {
    if (address.startsWith('unix://')) r.fail([...path, 'address'], 'unix socket endpoints are not supported');
    else if (resolution === 'STATIC' && !net.isIP(address)) {
      r.fail([...path, 'address'], `"${address}" is not an IP address (${standalone ? 'a WorkloadEntry needs one' : 'resolution STATIC needs IP addresses; use resolution DNS for hostnames'})`);
    } else if (!net.isIP(address) && !HOST.test(address)) r.fail([...path, 'address'], `"${address}" is neither an IP address nor a hostname`);
  }
  const ports: Record<string, number> = {};
  const po = r.object(o.ports, [...path, 'ports'], Object.keys((o.ports as object | undefined) ?? {}));
  for (const [k, val] of Object.entries(po ?? {})) {
    const n = r.port(val, [...path, 'ports', k], true);
    if (n !== undefined) ports[k] = n;
  }
  const labels = r.stringMap(o.labels, [...path, 'labels']);
  const weight = r.int(o.weight, [...path, 'weight'], { min: 1, max: 128 });
  if (address === undefined) return undefined;
  const out: WorkloadEntrySpec = { address, ports, labels };
  if (weight !== undefined) out.weight = weight;
  return out;
}

function readHosts(r: Reader, v: unknown, path: Path, allowStar: boolean): string[] {
  const hosts: string[] = [];
  r.array(v, path, { required: true, nonEmpty: true }).forEach((h, i) => {
    const s = r.string(h, [...path, i], { required: true, pattern: HOST, patternText: 'a hostname' });
    if (s === undefined) return;
    if (s === '*' && !allowStar) r.fail([...path, i], '"*" is not allowed here');
    else if (hosts.includes(s)) r.fail([...path, i], `host "${s}" is listed twice`);
    else hosts.push(s);
  });
  return hosts;
}

function readStringMatch(r: Reader, v: unknown, path: Path): StringMatch | undefined {
  const o = r.object(v, path, ['exact', 'prefix', 'regex']);
  if (!o) return undefined;
  const keys = Object.keys(o);
  if (keys.length !== 1) return r.fail(path, 'needs exactly one of exact, prefix, regex');
  const k = keys[0] as 'exact' | 'prefix' | 'regex';
  const s = r.string(o[k], [...path, k], { required: k !== 'exact' });
  if (s === undefined) return undefined;
  if (k === 'regex') {
    try {
      new RegExp(s);
    } catch (e) {
      return r.fail([...path, k], `invalid regular expression: ${(e as Error).message}`);
    }
  }
  return { [k]: s } as StringMatch;
}

function readVirtualService(r: Reader, v: unknown, path: Path): VirtualServiceSpec | undefined {
  const o = r.object(v, path, ['hosts', 'gateways', 'http', 'exportTo'], ['hosts']);
  if (!o) return undefined;
  if (o.exportTo !== undefined) {
    const ex = r.array(o.exportTo, [...path, 'exportTo']);
    if (!(ex.length === 1 && ex[0] === '*')) r.fail([...path, 'exportTo'], 'only ["*"] is supported (every config is visible to every proxy)');
  }
  const hosts = readHosts(r, o.hosts, [...path, 'hosts'], true);
  const gateways: string[] = [];
  r.array(o.gateways, [...path, 'gateways']).forEach((g, i) => {
    const s = r.string(g, [...path, 'gateways', i], { required: true, pattern: /^(mesh|([a-z0-9-]+\/)?[a-z0-9.-]+)$/, patternText: 'mesh, a Gateway name, or namespace/name' });
    if (s !== undefined) gateways.push(s);
  });
  const http: HttpRoute[] = [];
  r.array(o.http, [...path, 'http'], { required: true, nonEmpty: true }).forEach((h, i) => {
    const route = readHttpRoute(r, h, [...path, 'http', i]);
    if (route) http.push(route);
  });
  return { hosts, gateways, http };
}

function readHttpRoute(r: Reader, v: unknown, path: Path): HttpRoute | undefined {
  const o = r.object(v, path, ['name', 'match', 'route', 'timeout', 'retries', 'rewrite'], ['route']);
  if (!o) return undefined;
  const out: HttpRoute = { match: [], route: [] };
  const name = r.string(o.name, [...path, 'name']);
  if (name !== undefined) out.name = name;
  r.array(o.match, [...path, 'match']).forEach((m, i) => {
    const mp = [...path, 'match', i];
    const mo = r.object(m, mp, ['name', 'uri', 'headers', 'port', 'ignoreUriCase']);
    if (!mo) return;
    r.string(mo.name, [...mp, 'name']);
    const match: HttpMatch = { headers: {}, ignoreUriCase: r.bool(mo.ignoreUriCase, [...mp, 'ignoreUriCase']) ?? false };
    if (mo.uri !== undefined) match.uri = readStringMatch(r, mo.uri, [...mp, 'uri']);
    const ho = r.object(mo.headers, [...mp, 'headers'], Object.keys((mo.headers as object | undefined) ?? {}));
    const headers: Record<string, StringMatch> = {};
    for (const [hn, hv] of Object.entries(ho ?? {})) {
      if (!/^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/.test(hn)) r.fail([...mp, 'headers', hn], `"${hn}" is not a valid header name`);
      const sm = readStringMatch(r, hv, [...mp, 'headers', hn]);
      if (sm) headers[hn.toLowerCase()] = sm;
    }
    match.headers = headers;
    const port = r.port(mo.port, [...mp, 'port']);
    if (port !== undefined) match.port = port;
    out.match.push(match);
  });
  const dests = r.array(o.route, [...path, 'route'], { required: true, nonEmpty: true });
  dests.forEach((d, i) => {
    const dp = [...path, 'route', i];
    const dO = r.object(d, dp, ['destination', 'weight'], ['destination']);
    if (!dO) return;
    const de = r.object(dO.destination, [...dp, 'destination'], ['host', 'subset', 'port'], ['host']);
    const host = r.string(de?.host, [...dp, 'destination', 'host'], { required: true, pattern: HOST, patternText: 'a hostname' });
    const subset = r.string(de?.subset, [...dp, 'destination', 'subset']);
    const po = r.object(de?.port, [...dp, 'destination', 'port'], ['number'], ['number']);
    const port = po ? r.port(po.number, [...dp, 'destination', 'port', 'number'], true) : undefined;
    const weight = r.int(dO.weight, [...dp, 'weight'], { min: 0, max: 100 });
    if (dO.weight === undefined && dests.length > 1) r.fail([...dp, 'weight'], 'is required when a route has more than one destination');
    if (weight === undefined && dO.weight !== undefined) return;
    if (host === undefined) return;
    const rd: RouteDestination = { host, weight: weight ?? 100 };
    if (subset !== undefined) rd.subset = subset;
    if (port !== undefined) rd.port = port;
    out.route.push(rd);
  });
  if (dests.length > 1 && out.route.length === dests.length) {
    const sum = out.route.reduce((a, d) => a + d.weight, 0);
    if (sum !== 100) r.fail([...path, 'route'], `destination weights add up to ${sum}, not 100`);
  }
  const timeoutMs = r.duration(o.timeout, [...path, 'timeout']);
  if (timeoutMs !== undefined) out.timeoutMs = timeoutMs;
  const ro = r.object(o.retries, [...path, 'retries'], ['attempts', 'perTryTimeout', 'retryOn'], ['attempts']);
  if (ro) {
    const attempts = r.int(ro.attempts, [...path, 'retries', 'attempts'], { required: true, min: 0, max: 100 });
    const perTry = r.duration(ro.perTryTimeout, [...path, 'retries', 'perTryTimeout']);
    const retryOn = r.string(ro.retryOn, [...path, 'retries', 'retryOn'], { pattern: /^[a-z0-9,-]+$/, patternText: 'a comma-separated list of Envoy retry conditions' });
    if (attempts !== undefined) {
      out.retries = { attempts };
      if (perTry !== undefined) out.retries.perTryTimeoutMs = perTry;
      if (retryOn !== undefined) out.retries.retryOn = retryOn;
    }
  }
  const rw = r.object(o.rewrite, [...path, 'rewrite'], ['uri', 'authority']);
  if (rw) {
    const uri = r.string(rw.uri, [...path, 'rewrite', 'uri']);
    const authority = r.string(rw.authority, [...path, 'rewrite', 'authority']);
    out.rewrite = {};
    if (uri !== undefined) out.rewrite.uri = uri;
    if (authority !== undefined) out.rewrite.authority = authority;
    if (uri !== undefined && !out.match.every((m) => m.uri && 'prefix' in m.uri)) {
      r.fail([...path, 'rewrite', 'uri'], 'a uri rewrite needs every match of this route to be a uri prefix match');
    }
  }
  return out;
}

function readTrafficPolicy(r: Reader, v: unknown, path: Path): TrafficPolicy | undefined {
  const o = r.object(v, path, ['loadBalancer', 'connectionPool', 'outlierDetection']);
  if (!o) return undefined;
  const out: TrafficPolicy = {};
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

function readDestinationRule(r: Reader, v: unknown, path: Path): DestinationRuleSpec | undefined {
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

function readGateway(r: Reader, v: unknown, path: Path): GatewaySpec | undefined {
  const o = r.object(v, path, ['selector', 'servers'], ['servers']);
  if (!o) return undefined;
  const selector = r.stringMap(o.selector, [...path, 'selector']);
  const servers: GatewayServer[] = [];
  r.array(o.servers, [...path, 'servers'], { required: true, nonEmpty: true }).forEach((s, i) => {
    const sp = [...path, 'servers', i];
    const so = r.object(s, sp, ['port', 'hosts', 'bind', 'name'], ['port', 'hosts']);
    if (!so) return;
    r.string(so.name, [...sp, 'name']);
    const po = r.object(so.port, [...sp, 'port'], ['number', 'name', 'protocol'], ['number', 'name', 'protocol']);
    const number = r.port(po?.number, [...sp, 'port', 'number'], true);
    const name = r.string(po?.name, [...sp, 'port', 'name'], { required: true });
    const protocol = r.oneOf(po?.protocol, [...sp, 'port', 'protocol'], ['HTTP', 'HTTP2'] as const, { required: true, unsupported: ['HTTPS', 'TLS', 'TCP', 'GRPC', 'MONGO', 'REDIS'] });
    const hosts: string[] = [];
    r.array(so.hosts, [...sp, 'hosts'], { required: true, nonEmpty: true }).forEach((h, j) => {
      const hs = r.string(h, [...sp, 'hosts', j], { required: true });
      if (hs === undefined) return;
      const slash = hs.indexOf('/');
      const hostPart = slash < 0 ? hs : hs.slice(slash + 1);
      const nsPart = slash < 0 ? undefined : hs.slice(0, slash);
      if (nsPart !== undefined && nsPart !== '*' && nsPart !== '.' && !DNS_LABEL.test(nsPart)) r.fail([...sp, 'hosts', j], `"${nsPart}" is not a namespace`);
      if (!HOST.test(hostPart)) r.fail([...sp, 'hosts', j], `"${hostPart}" is not a hostname`);
      hosts.push(hs);
    });
    const bind = r.string(so.bind, [...sp, 'bind']);
    if (bind !== undefined && !net.isIP(bind)) r.fail([...sp, 'bind'], `"${bind}" is not an IP address`);
    if (number === undefined || name === undefined || protocol === undefined) return;
    const server: GatewayServer = { port: { number, name, protocol }, hosts };
    if (bind !== undefined) server.bind = bind;
    servers.push(server);
  });
  return { selector, servers };
}

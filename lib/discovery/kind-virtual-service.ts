// VirtualService reader: HTTP routes with uri/header/source matches, weighted destinations, timeout, retries,
// rewrite, fault injection, CORS, mirroring and header manipulation; TCP routes by port with weighted destinations.

import { dict } from '../dict';
import { GRPC_STATUS_NAMES } from '../grpc-status';
import type {
  CorsPolicy,
  HeaderOperations,
  HttpFault,
  HttpMatch,
  HttpRoute,
  RouteDestination,
  StringMatch,
  TcpRoute,
  VirtualServiceSpec,
} from './model';
import { readExportTo } from './visibility';
import { HOST, type Path, type Reader, readHosts } from './schema';
import { readTlsRoutes } from './kind-tls';
import { readSourceMatch, SOURCE_MATCH_FIELDS } from './source-match';

export function readVirtualService(r: Reader, v: unknown, path: Path): VirtualServiceSpec | undefined {
  const o = r.object(v, path, ['hosts', 'gateways', 'http', 'tcp', 'tls', 'exportTo'], ['hosts']);
  if (!o) return undefined;
  const exportTo = readExportTo(r, o.exportTo, [...path, 'exportTo']);
  const hosts = readHosts(r, o.hosts, [...path, 'hosts'], true);
  const gateways: string[] = [];
  r.array(o.gateways, [...path, 'gateways']).forEach((g, i) => {
    const s = r.string(g, [...path, 'gateways', i], {
      required: true,
      pattern: /^(mesh|([a-z0-9-]+\/)?[a-z0-9.-]+)$/,
      patternText: 'mesh, a Gateway name, or namespace/name',
    });
    if (s !== undefined) gateways.push(s);
  });
  const http: HttpRoute[] = [];
  r.array(o.http, [...path, 'http']).forEach((h, i) => {
    const route = readHttpRoute(r, h, [...path, 'http', i]);
    if (route) http.push(route);
  });
  const tcp: TcpRoute[] = [];
  r.array(o.tcp, [...path, 'tcp']).forEach((t, i) => {
    const tp = [...path, 'tcp', i];
    const to = r.object(t, tp, ['match', 'route'], ['route']);
    if (!to) return;
    const match: { port?: number }[] = [];
    r.array(to.match, [...tp, 'match']).forEach((m, j) => {
      const mo = r.object(m, [...tp, 'match', j], ['port']);
      const port = r.port(mo?.port, [...tp, 'match', j, 'port']);
      match.push(port === undefined ? {} : { port });
    });
    tcp.push({ match, route: readDestinations(r, to.route, [...tp, 'route']) });
  });
  const tls = readTlsRoutes(r, o.tls, [...path, 'tls'], readDestinations);
  if (!http.length && !tcp.length && !tls.length) r.fail(path, 'needs http, tcp or tls routes');
  const out: VirtualServiceSpec = { hosts, gateways, http, tcp };
  if (tls.length) out.tls = tls;
  if (exportTo) out.exportTo = exportTo;
  return out;
}

function readHttpRoute(r: Reader, v: unknown, path: Path): HttpRoute | undefined {
  const o = r.object(v, path, [
    'name',
    'match',
    'route',
    'redirect',
    'directResponse',
    'timeout',
    'retries',
    'rewrite',
    'fault',
    'corsPolicy',
    'mirror',
    'mirrorPercentage',
    'headers',
  ]);
  if (!o) return undefined;
  const actions = ['route', 'redirect', 'directResponse'].filter((k) => o[k] !== undefined);
  if (actions.length !== 1)
    r.fail(
      path,
      `needs exactly one of route, redirect, directResponse${actions.length ? ` (has ${actions.join(', ')})` : ''}`,
    );
  const out: HttpRoute = { match: [], route: [] };
  const name = r.string(o.name, [...path, 'name']);
  if (name !== undefined) out.name = name;
  r.array(o.match, [...path, 'match']).forEach((m, i) => {
    const mp = [...path, 'match', i];
    const mo = r.object(m, mp, [
      'name',
      'uri',
      'headers',
      'port',
      'ignoreUriCase',
      'method',
      'authority',
      'scheme',
      'queryParams',
      'withoutHeaders',
      ...SOURCE_MATCH_FIELDS,
    ]);
    if (!mo) return;
    r.string(mo.name, [...mp, 'name']);
    const match: HttpMatch = {
      headers: {},
      ignoreUriCase: r.bool(mo.ignoreUriCase, [...mp, 'ignoreUriCase']) ?? false,
    };
    if (mo.uri !== undefined) match.uri = readStringMatch(r, mo.uri, [...mp, 'uri']);
    const matchMap = (key: 'headers' | 'withoutHeaders' | 'queryParams') => {
      const out = dict<StringMatch>();
      for (const [hn, hv] of Object.entries(r.mapping(mo[key], [...mp, key]) ?? {})) {
        if (!/^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/.test(hn))
          r.fail([...mp, key, hn], `"${hn}" is not a valid ${key === 'queryParams' ? 'parameter' : 'header'} name`);
        const sm = readStringMatch(r, hv, [...mp, key, hn]);
        if (sm) out[key === 'queryParams' ? hn : hn.toLowerCase()] = sm;
      }
      return out;
    };
    match.headers = matchMap('headers');
    const without = matchMap('withoutHeaders');
    if (Object.keys(without).length) match.withoutHeaders = without;
    const qp = matchMap('queryParams');
    if (Object.keys(qp).length) match.queryParams = qp;
    for (const k of ['method', 'authority', 'scheme'] as const) {
      if (mo[k] === undefined) continue;
      const sm = readStringMatch(r, mo[k], [...mp, k]);
      if (sm) match[k] = sm;
    }
    const port = r.port(mo.port, [...mp, 'port']);
    if (port !== undefined) match.port = port;
    readSourceMatch(r, mo, mp, match);
    out.match.push(match);
  });
  if (o.route !== undefined || actions.length !== 1) out.route = readDestinations(r, o.route, [...path, 'route'], true);
  const rd = r.object(
    o.redirect,
    [...path, 'redirect'],
    ['uri', 'authority', 'port', 'derivePort', 'scheme', 'redirectCode'],
  );
  if (rd) {
    const rp = [...path, 'redirect'];
    out.redirect = {};
    const uri = r.string(rd.uri, [...rp, 'uri']);
    const authority = r.string(rd.authority, [...rp, 'authority']);
    const port = r.port(rd.port, [...rp, 'port']);
    if (rd.port !== undefined && rd.derivePort !== undefined) r.fail(rp, 'port and derivePort are exclusive');
    const derivePort = r.oneOf(rd.derivePort, [...rp, 'derivePort'], [
      'FROM_PROTOCOL_DEFAULT',
      'FROM_REQUEST_PORT',
    ] as const);
    if (derivePort !== undefined) out.redirect.derivePort = derivePort;
    const scheme = r.oneOf(rd.scheme, [...rp, 'scheme'], ['http', 'https'] as const);
    const code = r.int(rd.redirectCode, [...rp, 'redirectCode']);
    if (code !== undefined && !REDIRECT_CODES.includes(code))
      r.fail([...rp, 'redirectCode'], `${code} is not one of ${REDIRECT_CODES.join(', ')}`);
    if (uri !== undefined) out.redirect.uri = uri;
    if (authority !== undefined) out.redirect.authority = authority;
    if (port !== undefined) out.redirect.port = port;
    if (scheme !== undefined) out.redirect.scheme = scheme;
    if (code !== undefined) out.redirect.redirectCode = code;
  }
  const dr = r.object(o.directResponse, [...path, 'directResponse'], ['status', 'body'], ['status']);
  if (dr) {
    const status = r.int(dr.status, [...path, 'directResponse', 'status'], { required: true, min: 200, max: 599 });
    const bp = [...path, 'directResponse', 'body'];
    const body = r.object(dr.body, bp, ['string', 'bytes']);
    if (body && (body.string === undefined) === (body.bytes === undefined))
      r.fail(bp, 'needs exactly one of string, bytes');
    const text = r.string(body?.string, [...bp, 'string']);
    const bytes = r.string(body?.bytes, [...bp, 'bytes'], { pattern: /^[A-Za-z0-9+/]*={0,2}$/, patternText: 'base64' });
    if (status !== undefined)
      out.directResponse = {
        status,
        ...(text !== undefined && { body: text }),
        ...(bytes !== undefined && { bodyBytes: bytes }),
      };
  }
  for (const k of ['mirror', 'retries', 'timeout', 'rewrite'] as const) {
    if (!o.route && o[k] !== undefined)
      r.fail([...path, k], 'applies only to a route, not to a redirect or directResponse');
  }
  const timeoutMs = r.duration(o.timeout, [...path, 'timeout']);
  if (timeoutMs !== undefined) out.timeoutMs = timeoutMs;
  const ro = r.object(
    o.retries,
    [...path, 'retries'],
    ['attempts', 'perTryTimeout', 'retryOn', 'retryIgnorePreviousHosts', 'backoff', 'retryRemoteLocalities'],
    ['attempts'],
  );
  if (ro) {
    const attempts = r.int(ro.attempts, [...path, 'retries', 'attempts'], { required: true, min: 0, max: 100 });
    const perTry = r.duration(ro.perTryTimeout, [...path, 'retries', 'perTryTimeout']);
    const retryOn = r.string(ro.retryOn, [...path, 'retries', 'retryOn'], {
      pattern: /^[a-z0-9, -]+$/,
      patternText: 'a comma-separated list of Envoy retry conditions and status codes',
    });
    if (attempts !== undefined) {
      out.retries = { attempts };
      if (perTry !== undefined) out.retries.perTryTimeoutMs = perTry;
      if (retryOn !== undefined) out.retries.retryOn = retryOn;
      const ignore = r.bool(ro.retryIgnorePreviousHosts, [...path, 'retries', 'retryIgnorePreviousHosts']);
      if (ignore !== undefined) out.retries.ignorePreviousHosts = ignore;
      const backoff = r.duration(ro.backoff, [...path, 'retries', 'backoff']);
      if (backoff !== undefined) out.retries.backoffMs = backoff;
      const remote = r.bool(ro.retryRemoteLocalities, [...path, 'retries', 'retryRemoteLocalities']);
      if (remote !== undefined) out.retries.retryRemoteLocalities = remote;
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
  const fault = readFault(r, o.fault, [...path, 'fault']);
  if (fault) out.fault = fault;
  const cors = readCors(r, o.corsPolicy, [...path, 'corsPolicy']);
  if (cors) out.corsPolicy = cors;
  const mo = r.object(o.mirror, [...path, 'mirror'], ['host', 'subset', 'port'], ['host']);
  if (mo) {
    const host = r.string(mo.host, [...path, 'mirror', 'host'], {
      required: true,
      pattern: HOST,
      patternText: 'a hostname',
    });
    const subset = r.string(mo.subset, [...path, 'mirror', 'subset']);
    const po = r.object(mo.port, [...path, 'mirror', 'port'], ['number'], ['number']);
    const port = po ? r.port(po.number, [...path, 'mirror', 'port', 'number'], true) : undefined;
    if (host !== undefined) {
      out.mirror = { host };
      if (subset !== undefined) out.mirror.subset = subset;
      if (port !== undefined) out.mirror.port = port;
    }
  }
  const mp = readPercentage(r, o.mirrorPercentage, [...path, 'mirrorPercentage']);
  if (mp !== undefined) {
    if (!mo) r.fail([...path, 'mirrorPercentage'], 'needs mirror');
    out.mirrorPercentage = mp;
  }
  const ho = r.object(o.headers, [...path, 'headers'], ['request', 'response']);
  if (ho) {
    out.headers = {};
    const req = readHeaderOps(r, ho.request, [...path, 'headers', 'request']);
    const res = readHeaderOps(r, ho.response, [...path, 'headers', 'response']);
    if (req) out.headers.request = req;
    if (res) out.headers.response = res;
  }
  return out;
}

/** `route` of an HTTP or TCP route: weighted destinations (with `headers` for HTTP). */
function readDestinations(r: Reader, v: unknown, path: Path, http = false): RouteDestination[] {
  const out: RouteDestination[] = [];
  const dests = r.array(v, path, { required: true, nonEmpty: true });
  dests.forEach((d, i) => {
    const dp = [...path, i];
    const dO = r.object(d, dp, http ? ['destination', 'weight', 'headers'] : ['destination', 'weight'], [
      'destination',
    ]);
    if (!dO) return;
    const de = r.object(dO.destination, [...dp, 'destination'], ['host', 'subset', 'port'], ['host']);
    const host = r.string(de?.host, [...dp, 'destination', 'host'], {
      required: true,
      pattern: HOST,
      patternText: 'a hostname',
    });
    const subset = r.string(de?.subset, [...dp, 'destination', 'subset']);
    const po = r.object(de?.port, [...dp, 'destination', 'port'], ['number'], ['number']);
    const port = po ? r.port(po.number, [...dp, 'destination', 'port', 'number'], true) : undefined;
    const weight = r.int(dO.weight, [...dp, 'weight'], { min: 0, max: 100 });
    if (dO.weight === undefined && dests.length > 1)
      r.fail([...dp, 'weight'], 'is required when a route has more than one destination');
    if (weight === undefined && dO.weight !== undefined) return;
    if (host === undefined) return;
    const rd: RouteDestination = { host, weight: weight ?? 100 };
    if (subset !== undefined) rd.subset = subset;
    if (port !== undefined) rd.port = port;
    const ho = r.object(dO.headers, [...dp, 'headers'], ['request', 'response']);
    if (ho) {
      const req = readHeaderOps(r, ho.request, [...dp, 'headers', 'request']);
      const res = readHeaderOps(r, ho.response, [...dp, 'headers', 'response']);
      rd.headers = { ...(req && { request: req }), ...(res && { response: res }) };
    }
    out.push(rd);
  });
  if (dests.length > 1 && out.length === dests.length) {
    const sum = out.reduce((a, d) => a + d.weight, 0);
    if (sum !== 100) r.fail(path, `destination weights add up to ${sum}, not 100`);
  }
  return out;
}

/** Istio's Percent message: `{value: 12.5}`. */
function readPercentage(r: Reader, v: unknown, path: Path): number | undefined {
  const o = r.object(v, path, ['value'], ['value']);
  if (!o) return undefined;
  if (typeof o.value !== 'number' || o.value < 0 || o.value > 100)
    return r.fail([...path, 'value'], 'must be a number from 0 to 100');
  return o.value;
}

function readFault(r: Reader, v: unknown, path: Path): HttpFault | undefined {
  const o = r.object(v, path, ['delay', 'abort']);
  if (!o) return undefined;
  const out: HttpFault = {};
  const d = r.object(o.delay, [...path, 'delay'], ['fixedDelay', 'percentage', 'percent', 'exponentialDelay']);
  if (d) {
    if (d.exponentialDelay !== undefined)
      r.fail(
        [...path, 'delay', 'exponentialDelay'],
        'is not supported (Istio does not implement it either); use fixedDelay',
      );
    if (d.percent !== undefined)
      r.fail([...path, 'delay', 'percent'], 'is deprecated and not supported; use percentage: {value: N}');
    const ms = r.duration(d.fixedDelay, [...path, 'delay', 'fixedDelay']);
    if (d.fixedDelay === undefined) r.fail([...path, 'delay', 'fixedDelay'], 'is required');
    const pct = readPercentage(r, d.percentage, [...path, 'delay', 'percentage']);
    if (ms !== undefined) out.delay = pct === undefined ? { fixedDelayMs: ms } : { fixedDelayMs: ms, percentage: pct };
  }
  const a = r.object(o.abort, [...path, 'abort'], ['httpStatus', 'percentage', 'grpcStatus', 'http2Error']);
  if (a) {
    if (a.http2Error !== undefined)
      r.fail(
        [...path, 'abort', 'http2Error'],
        'is not supported (Istio does not implement it either); use httpStatus or grpcStatus',
      );
    if ((a.httpStatus === undefined) === (a.grpcStatus === undefined) && a.http2Error === undefined)
      r.fail([...path, 'abort'], 'needs exactly one of httpStatus, grpcStatus');
    const status = r.int(a.httpStatus, [...path, 'abort', 'httpStatus'], { min: 200, max: 599 });
    const grpc = r.oneOf(a.grpcStatus, [...path, 'abort', 'grpcStatus'], GRPC_STATUS_NAMES);
    const pct = readPercentage(r, a.percentage, [...path, 'abort', 'percentage']);
    if (status !== undefined || grpc !== undefined) {
      out.abort = {
        ...(status !== undefined && { httpStatus: status }),
        ...(grpc !== undefined && { grpcStatus: GRPC_STATUS_NAMES.indexOf(grpc) }),
        ...(pct !== undefined && { percentage: pct }),
      };
    }
  }
  if (!out.delay && !out.abort && !r.problems.length) r.fail(path, 'needs delay or abort');
  return out;
}

function readCors(r: Reader, v: unknown, path: Path): CorsPolicy | undefined {
  const o = r.object(v, path, [
    'allowOrigins',
    'allowMethods',
    'allowHeaders',
    'exposeHeaders',
    'maxAge',
    'allowCredentials',
    'allowOrigin',
  ]);
  if (!o) return undefined;
  if (o.allowOrigin !== undefined)
    r.fail([...path, 'allowOrigin'], 'is deprecated and not supported; use allowOrigins with exact, prefix or regex');
  const strings = (k: string) =>
    r
      .array(o[k], [...path, k])
      .map((x, i) => r.string(x, [...path, k, i], { required: true }))
      .filter((x): x is string => x !== undefined);
  const out: CorsPolicy = {
    allowOrigins: r
      .array(o.allowOrigins, [...path, 'allowOrigins'])
      .map((x, i) => readStringMatch(r, x, [...path, 'allowOrigins', i]))
      .filter((x): x is StringMatch => x !== undefined),
    allowMethods: strings('allowMethods'),
    allowHeaders: strings('allowHeaders'),
    exposeHeaders: strings('exposeHeaders'),
  };
  const maxAge = r.duration(o.maxAge, [...path, 'maxAge']);
  if (maxAge !== undefined) out.maxAgeMs = maxAge;
  const cred = r.bool(o.allowCredentials, [...path, 'allowCredentials']);
  if (cred !== undefined) out.allowCredentials = cred;
  return out;
}

const REDIRECT_CODES = [301, 302, 303, 307, 308];

const HEADER_NAME = /^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/;

function readHeaderOps(r: Reader, v: unknown, path: Path): HeaderOperations | undefined {
  const o = r.object(v, path, ['set', 'add', 'remove']);
  if (!o) return undefined;
  const map = (k: 'set' | 'add') => {
    const m = r.stringMap(o[k], [...path, k]);
    for (const h of Object.keys(m))
      if (!HEADER_NAME.test(h)) r.fail([...path, k, h], `"${h}" is not a valid header name`);
    return m;
  };
  const remove = r
    .array(o.remove, [...path, 'remove'])
    .map((x, i) =>
      r.string(x, [...path, 'remove', i], { required: true, pattern: HEADER_NAME, patternText: 'a header name' }),
    )
    .filter((x): x is string => x !== undefined);
  return { set: map('set'), add: map('add'), remove };
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

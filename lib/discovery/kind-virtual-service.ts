// VirtualService reader: HTTP routes with uri/header matches, weighted destinations, timeout, retries, rewrite.

import type { HttpMatch, HttpRoute, RouteDestination, StringMatch, VirtualServiceSpec } from './model';
import { HOST, type Path, type Reader, readHosts } from './schema';

export function readVirtualService(r: Reader, v: unknown, path: Path): VirtualServiceSpec | undefined {
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
    const ho = r.mapping(mo.headers, [...mp, 'headers']);
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

// Gateway reader: servers with ports (HTTP, HTTP2, GRPC, HTTPS, TLS, TCP), hosts (optionally namespace-qualified), a
// bind address and `tls` (./kind-tls.ts).

import * as net from 'node:net';
import type { GatewayServer, GatewaySpec } from './model';
import { DNS_LABEL, HOST, type Path, type Reader } from './schema';
import { readServerTls } from './kind-tls';

export function readGateway(r: Reader, v: unknown, path: Path): GatewaySpec | undefined {
  const o = r.object(v, path, ['selector', 'servers'], ['servers']);
  if (!o) return undefined;
  const selector = r.stringMap(o.selector, [...path, 'selector']);
  const servers: GatewayServer[] = [];
  r.array(o.servers, [...path, 'servers'], { required: true, nonEmpty: true }).forEach((s, i) => {
    const sp = [...path, 'servers', i];
    const so = r.object(s, sp, ['port', 'hosts', 'bind', 'name', 'tls'], ['port', 'hosts']);
    if (!so) return;
    r.string(so.name, [...sp, 'name']);
    const po = r.object(so.port, [...sp, 'port'], ['number', 'name', 'protocol'], ['number', 'name', 'protocol']);
    const number = r.port(po?.number, [...sp, 'port', 'number'], true);
    const name = r.string(po?.name, [...sp, 'port', 'name'], { required: true });
    const protocol = r.oneOf(
      po?.protocol,
      [...sp, 'port', 'protocol'],
      ['HTTP', 'HTTP2', 'GRPC', 'HTTPS', 'TLS', 'TCP'] as const,
      { required: true, unsupported: ['MONGO', 'REDIS', 'MYSQL', 'HTTP_PROXY'] },
    );
    const tls = readServerTls(r, so.tls, [...sp, 'tls'], protocol);
    if ((protocol === 'HTTPS' || protocol === 'TLS') && so.tls === undefined)
      r.fail([...sp, 'tls'], `is required for a ${protocol} server`);
    const hosts: string[] = [];
    r.array(so.hosts, [...sp, 'hosts'], { required: true, nonEmpty: true }).forEach((h, j) => {
      const hs = r.string(h, [...sp, 'hosts', j], { required: true });
      if (hs === undefined) return;
      const slash = hs.indexOf('/');
      const hostPart = slash < 0 ? hs : hs.slice(slash + 1);
      const nsPart = slash < 0 ? undefined : hs.slice(0, slash);
      if (nsPart !== undefined && nsPart !== '*' && nsPart !== '.' && !DNS_LABEL.test(nsPart))
        r.fail([...sp, 'hosts', j], `"${nsPart}" is not a namespace`);
      if (!HOST.test(hostPart)) r.fail([...sp, 'hosts', j], `"${hostPart}" is not a hostname`);
      hosts.push(hs);
    });
    const bind = r.string(so.bind, [...sp, 'bind']);
    if (bind !== undefined && !net.isIP(bind)) r.fail([...sp, 'bind'], `"${bind}" is not an IP address`);
    if (number === undefined || name === undefined || protocol === undefined) return;
    const server: GatewayServer = { port: { number, name, protocol }, hosts };
    if (bind !== undefined) server.bind = bind;
    if (tls) server.tls = tls;
    servers.push(server);
  });
  checkPorts(r, servers, path);
  return { selector, servers };
}

/** One port carries plaintext HTTP servers, or TLS servers told apart by SNI, or one TCP server (as istiod merges). */
function checkPorts(r: Reader, servers: readonly GatewayServer[], path: Path): void {
  const cls = (s: GatewayServer) =>
    s.port.protocol === 'HTTPS' || s.port.protocol === 'TLS' ? 'tls' : s.port.protocol === 'TCP' ? 'tcp' : 'http';
  const first = new Map<string, { i: number; s: GatewayServer }>();
  const sni = new Map<string, number>();
  servers.forEach((s, i) => {
    const key = String(s.port.number);
    const f = first.get(key);
    const pp = [...path, 'servers', i, 'port'];
    if (!f) first.set(key, { i, s });
    else if (cls(f.s) !== cls(s))
      r.fail(
        [...pp, 'protocol'],
        `port ${s.port.number} already has a ${f.s.port.protocol} server (servers[${f.i}]); HTTP, TLS-based and TCP servers cannot share a port`,
      );
    else if (cls(s) === 'tcp')
      r.fail([...pp, 'number'], `port ${s.port.number} already has a TCP server (servers[${f.i}])`);
    else if (cls(s) === 'tls' && s.port.name === f.s.port.name && s.tls?.mode !== 'PASSTHROUGH')
      r.fail(
        [...pp, 'name'],
        `port name "${s.port.name}" is already used by servers[${f.i}] on this port; TLS servers on one port need distinct names`,
      );
    if (cls(s) !== 'tls' || s.tls?.mode === 'PASSTHROUGH') return;
    // Terminating servers become filter chains matched by SNI: one host on two of them is one match twice.
    for (const h of s.hosts) {
      const host = h.includes('/') ? h.slice(h.indexOf('/') + 1) : h;
      const at = sni.get(`${key}|${host}`);
      if (at !== undefined && at !== i)
        r.fail(
          [...path, 'servers', i, 'hosts'],
          `host "${host}" is already served with TLS on port ${s.port.number} by servers[${at}]`,
        );
      sni.set(`${key}|${host}`, i);
    }
  });
}

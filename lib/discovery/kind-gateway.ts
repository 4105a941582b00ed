// Gateway reader: HTTP servers with ports, hosts (optionally namespace-qualified) and a bind address.

import * as net from 'node:net';
import type { GatewayServer, GatewaySpec } from './model';
import { DNS_LABEL, HOST, type Path, type Reader } from './schema';

export function readGateway(r: Reader, v: unknown, path: Path): GatewaySpec | undefined {
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

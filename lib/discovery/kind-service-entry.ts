// ServiceEntry and WorkloadEntry readers: hosts, ports and protocols, resolution, endpoints or a workload selector.

import * as net from 'node:net';
import type { Protocol, ServiceEntrySpec, ServicePort, WorkloadEntrySpec } from './model';
import { HOST, type Path, type Reader, readHosts } from './schema';
import { readExportTo } from './visibility';

const PROTOCOLS: readonly Protocol[] = ['HTTP', 'HTTP2', 'GRPC', 'TCP'];

const UNSUPPORTED_PROTOCOLS = ['HTTPS', 'TLS', 'MONGO', 'REDIS', 'MYSQL', 'UDP', 'GRPC-WEB'];

export function readServiceEntry(r: Reader, v: unknown, path: Path): ServiceEntrySpec | undefined {
  const o = r.object(
    v,
    path,
    ['hosts', 'addresses', 'ports', 'resolution', 'location', 'endpoints', 'workloadSelector', 'exportTo'],
    ['hosts', 'ports'],
  );
  const exportTo = readExportTo(r, o?.exportTo, [...path, 'exportTo']);
  if (!o) return undefined;
  const hosts = readHosts(r, o.hosts, [...path, 'hosts'], false);
  const ports: ServicePort[] = [];
  r.array(o.ports, [...path, 'ports'], { required: true, nonEmpty: true }).forEach((p, i) => {
    const pp = [...path, 'ports', i];
    const po = r.object(p, pp, ['number', 'name', 'protocol', 'targetPort'], ['number', 'name']);
    if (!po) return;
    const number = r.port(po.number, [...pp, 'number'], true);
    const name = r.string(po.name, [...pp, 'name'], { required: true });
    const protocol =
      r.oneOf(po.protocol, [...pp, 'protocol'], PROTOCOLS, { unsupported: UNSUPPORTED_PROTOCOLS }) ?? 'HTTP';
    const targetPort = r.port(po.targetPort, [...pp, 'targetPort']);
    if (number === undefined || name === undefined) return;
    if (ports.some((x) => x.number === number)) r.fail([...pp, 'number'], `port ${number} is listed twice`);
    if (ports.some((x) => x.name === name)) r.fail([...pp, 'name'], `port name "${name}" is listed twice`);
    ports.push(targetPort === undefined ? { number, name, protocol } : { number, name, protocol, targetPort });
  });
  const resolution =
    r.oneOf(o.resolution, [...path, 'resolution'], ['STATIC', 'DNS'] as const, {
      unsupported: ['NONE', 'DNS_ROUND_ROBIN'],
    }) ?? 'STATIC';
  const location =
    r.oneOf(o.location, [...path, 'location'], ['MESH_EXTERNAL', 'MESH_INTERNAL'] as const) ?? 'MESH_EXTERNAL';
  const endpoints: WorkloadEntrySpec[] = [];
  r.array(o.endpoints, [...path, 'endpoints']).forEach((e, i) => {
    const ep = readWorkload(r, e, [...path, 'endpoints', i], resolution, false);
    if (!ep) return;
    for (const pn of Object.keys(ep.ports)) {
      if (!ports.some((p) => p.name === pn))
        r.fail(
          [...path, 'endpoints', i, 'ports', pn],
          `names no port of this ServiceEntry (ports: ${ports.map((p) => p.name).join(', ')})`,
        );
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
  if (resolution === 'DNS' && hosts.some((h) => h.includes('*')))
    r.fail([...path, 'hosts'], 'a wildcard host cannot be resolved by DNS: use resolution STATIC with endpoints');
  const out: ServiceEntrySpec = { hosts, ports, resolution, location, endpoints };
  if (exportTo) out.exportTo = exportTo;
  if (workloadSelector) out.workloadSelector = workloadSelector;
  const addresses = readAddresses(r, o.addresses, [...path, 'addresses']);
  if (addresses.length) out.addresses = addresses;
  return out;
}

export function readWorkload(
  r: Reader,
  v: unknown,
  path: Path,
  resolution: 'STATIC' | 'DNS',
  standalone: boolean,
): WorkloadEntrySpec | undefined {
  const allowed = ['address', 'ports', 'labels', 'weight', 'network', 'locality', 'serviceAccount'];
  const o = r.object(v, path, allowed, ['address']);
  if (!o) return undefined;
  for (const f of ['network', 'locality', 'serviceAccount']) r.string(o[f], [...path, f]);
  const address = r.string(o.address, [...path, 'address'], { required: true });
  if (address !== undefined) {
    if (address.startsWith('unix://')) r.fail([...path, 'address'], 'unix socket endpoints are not supported');
    else if (resolution === 'STATIC' && !net.isIP(address)) {
      r.fail(
        [...path, 'address'],
        `"${address}" is not an IP address (${standalone ? 'a WorkloadEntry needs one' : 'resolution STATIC needs IP addresses; use resolution DNS for hostnames'})`,
      );
    } else if (!net.isIP(address) && !HOST.test(address))
      r.fail([...path, 'address'], `"${address}" is neither an IP address nor a hostname`);
  }
  const ports: Record<string, number> = {};
  const po = r.mapping(o.ports, [...path, 'ports']);
  for (const [k, val] of Object.entries(po ?? {})) {
    const n = r.port(val, [...path, 'ports', k], true);
    if (n !== undefined) ports[k] = n;
  }
  const labels = r.stringMap(o.labels, [...path, 'labels']);
  const weight = r.int(o.weight, [...path, 'weight'], { min: 1, max: 128 });
  if (address === undefined) return undefined;
  const out: WorkloadEntrySpec = { address, ports, labels };
  if (weight !== undefined) out.weight = weight;
  if (typeof o.serviceAccount === 'string' && o.serviceAccount) out.serviceAccount = o.serviceAccount;
  return out;
}

/** `addresses`: IPs or CIDRs (the service's VIPs; without any, the DNS proxy's name table gets an auto-allocated one). */
function readAddresses(r: Reader, v: unknown, path: Path): string[] {
  const out: string[] = [];
  r.array(v, path).forEach((a, i) => {
    const s = r.string(a, [...path, i], { required: true });
    if (s === undefined) return;
    const [ip, bits, extra] = s.split('/');
    const fam = net.isIP(ip ?? '');
    const okBits = bits === undefined || (/^\d{1,3}$/.test(bits) && Number(bits) <= (fam === 6 ? 128 : 32));
    if (!fam || !okBits || extra !== undefined) r.fail([...path, i], `"${s}" is not an IP address or CIDR`);
    else out.push(s);
  });
  return out;
}

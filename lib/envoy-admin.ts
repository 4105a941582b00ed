// A small client for Envoy's admin API, on the loopback address or the Unix socket (ENVOY_ADMIN_MODE=uds) the
// bootstrap binds it to.

import type * as httpType from 'node:http';

// node:http is loaded by the first request (after Envoy's spawn), not with this module, which Envoy's component
// loads before it (~3 ms of the start there). require, not import(): a single executable has no dynamic import of
// built-ins.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const http = () => require('node:http') as typeof httpType;

export type AdminAddress = { host: string; port: number } | { socketPath: string };

/** The errors of an admin that is not there (closed by a hot restart, or not yet bound), as opposed to a hung one. */
export function adminAbsent(err: { code?: string } | undefined): boolean {
  return err?.code === 'ECONNREFUSED' || err?.code === 'ENOENT';
}

export interface ServerInfo {
  state: string;
  restartEpoch: number;
  hotRestartVersion: string;
  uptimeCurrentEpoch: string;
}

export function adminRequest(
  addr: AdminAddress,
  method: string,
  path: string,
  timeoutMs = 2000,
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const where = 'socketPath' in addr ? { socketPath: addr.socketPath } : { host: addr.host, port: addr.port };
    const req = http().request({ ...where, method, path, agent: false, timeout: timeoutMs }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`Envoy admin ${method} ${path} timed out after ${timeoutMs} ms`)));
    req.on('error', reject);
    req.end();
  });
}

export async function serverInfo(addr: AdminAddress, timeoutMs = 1000): Promise<ServerInfo> {
  const { status, body } = await adminRequest(addr, 'GET', '/server_info', timeoutMs);
  if (status !== 200) throw new Error(`/server_info answered ${status}`);
  const j = JSON.parse(body) as {
    state: string;
    command_line_options?: { restart_epoch?: number };
    hot_restart_version?: string;
    uptime_current_epoch?: string;
  };
  return {
    state: j.state,
    restartEpoch: j.command_line_options?.restart_epoch ?? 0,
    hotRestartVersion: j.hot_restart_version ?? '',
    uptimeCurrentEpoch: j.uptime_current_epoch ?? '',
  };
}

export async function runningHotRestartVersion(addr: AdminAddress): Promise<string> {
  const { status, body } = await adminRequest(addr, 'GET', '/hot_restart_version');
  if (status !== 200) throw new Error(`/hot_restart_version answered ${status}`);
  return body.trim();
}

export async function drainListeners(
  addr: AdminAddress,
  opts: { inboundOnly: boolean; skipExit?: boolean },
): Promise<void> {
  let q = '/drain_listeners?graceful';
  if (opts.inboundOnly) q += '&inboundonly';
  if (opts.skipExit) q += '&skip_exit';
  const { status, body } = await adminRequest(addr, 'POST', q);
  if (status !== 200) throw new Error(`POST ${q} answered ${status}: ${body.trim()}`);
}

/** Sum of listener downstream_cx_active, leaving out the agent's own and admin listeners (as Istio does). */
export async function activeDownstreamConnections(addr: AdminAddress, ownPorts: number[]): Promise<number> {
  const { status, body } = await adminRequest(addr, 'GET', '/stats?usedonly&filter=downstream_cx_active$', 2000);
  if (status !== 200) throw new Error(`/stats answered ${status}`);
  let sum = 0;
  for (const line of body.split('\n')) {
    const m = /^listener\.(.+)\.downstream_cx_active: (\d+)$/.exec(line.trim());
    if (!m) continue;
    const name = m[1]!;
    if (
      name.startsWith('worker_') ||
      name.includes('.worker_') ||
      name.startsWith('admin') ||
      name.startsWith('envoy_internal')
    )
      continue;
    if (ownPorts.some((p) => name.endsWith(`_${p}`))) continue;
    sum += Number(m[2]);
  }
  return sum;
}

/**
 * The values of the named stats (counters and gauges), in one admin request; undefined when Envoy does not answer
 * 200, and a name Envoy has no stat for is absent from the map.
 */
export async function statValues(addr: AdminAddress, names: string[]): Promise<Map<string, number> | undefined> {
  const esc = names.map((n) => n.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'));
  const filter = encodeURIComponent(`^(${esc.join('|')})$`);
  const { status, body } = await adminRequest(addr, 'GET', `/stats?filter=${filter}`, 1000);
  if (status !== 200) return undefined;
  const wanted = new Set(names);
  const values = new Map<string, number>();
  for (const line of body.split('\n')) {
    const m = /^(\S+): (\d+)$/.exec(line);
    if (m && wanted.has(m[1]!)) values.set(m[1]!, Number(m[2]));
  }
  return values;
}

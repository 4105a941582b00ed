// What this process may do by its Linux capabilities (CapEff in /proc/self/status), not by its uid: under systemd
// root can have none (CapabilityBoundingSet=) and the istio-proxy user can hold one (AmbientCapabilities=).

import { readFileSync } from 'node:fs';

export const CAP_NET_BIND_SERVICE = 10;

/** The effective set from /proc/<pid>/status text; undefined when it has no CapEff line. */
export function effectiveCapabilities(status: string): bigint | undefined {
  const m = /^CapEff:\s*([0-9a-fA-F]+)\s*$/m.exec(status);
  return m ? BigInt(`0x${m[1]}`) : undefined;
}

function readOr(file: string): string | undefined {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return undefined;
  }
}

/**
 * Can this process bind `port`? Ports from ip_unprivileged_port_start (1024 unless the namespace lowered it, as
 * Kubernetes does for some pods) need nothing; below it, CAP_NET_BIND_SERVICE. Without /proc, root can.
 */
export function canBindPort(port: number, read: (file: string) => string | undefined = readOr): boolean {
  const start = Number(read('/proc/sys/net/ipv4/ip_unprivileged_port_start')?.trim() ?? 1024);
  if (port >= (Number.isInteger(start) ? start : 1024)) return true;
  const caps = effectiveCapabilities(read('/proc/self/status') ?? '');
  if (caps === undefined) return process.getuid?.() === 0;
  return (caps & (1n << BigInt(CAP_NET_BIND_SERVICE))) !== 0n;
}

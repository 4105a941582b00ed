// Auto-allocated VIPs for ServiceEntry hosts that list no address, from Istio's class E range 240.240.0.0/16 (never
// routed outside the host), so the DNS proxy can answer them and capture-mode listeners can match them.
//
// Stable across restarts and unrelated changes: a host's slot comes from a hash of its name; only when two hosts
// hash to the same slot does one of them probe on (double hashing over a prime number of slots, so the probe
// visits every slot). Hosts that keep their first-choice slot are placed before any host probes, so adding a host
// can only move an existing one that shares its first-choice slot and sorts after it.

import * as net from 'node:net';
import type { Service } from './model';

/** 240.240.a.b with b in 1..254: the largest prime number of slots that fits (254 * 256 = 65024). */
const SLOTS = 65011;

function fnv1a(s: string, seed = 0x811c9dc5): number {
  let h = seed;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

export function slotAddress(slot: number): string {
  return `240.240.${Math.floor(slot / 254)}.${(slot % 254) + 1}`;
}

function addressSlot(ip: string): number | undefined {
  const m = /^240\.240\.(\d+)\.(\d+)$/.exec(ip);
  if (!m) return undefined;
  const [a, b] = [Number(m[1]), Number(m[2])];
  const s = a * 254 + (b - 1);
  return b >= 1 && b <= 254 && s < SLOTS ? s : undefined;
}

/** Does this service get an auto-allocated VIP? (no address, not a wildcard, resolution not NONE) */
export function needsVip(svc: Pick<Service, 'hostname' | 'addresses' | 'resolution'>): boolean {
  return svc.addresses.length === 0 && !svc.hostname.includes('*') && (svc.resolution as string) !== 'NONE';
}

/** hostname -> allocated VIP for every service that needs one; deterministic for a given set of services. */
export function allocateVips(
  services: readonly Pick<Service, 'hostname' | 'addresses' | 'resolution'>[],
): Map<string, string> {
  const taken = new Set<number>();
  for (const s of services) {
    for (const a of s.addresses) {
      const slot = net.isIPv4(a) ? addressSlot(a) : undefined;
      if (slot !== undefined) taken.add(slot);
    }
  }
  const hosts = services
    .filter(needsVip)
    .map((s) => s.hostname)
    .sort();
  const out = new Map<string, string>();
  const probing: string[] = [];
  for (const h of hosts) {
    const first = fnv1a(h) % SLOTS;
    if (taken.has(first)) probing.push(h);
    else {
      taken.add(first);
      out.set(h, slotAddress(first));
    }
  }
  for (const h of probing) {
    if (taken.size >= SLOTS) break; // every slot used: the rest get no VIP (and no DNS entry)
    const first = fnv1a(h) % SLOTS;
    const step = 1 + (fnv1a(h, 0x01000193) % (SLOTS - 1));
    let slot = first;
    while (taken.has(slot)) slot = (slot + step) % SLOTS;
    taken.add(slot);
    out.set(h, slotAddress(slot));
  }
  return out;
}

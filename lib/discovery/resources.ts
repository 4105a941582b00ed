// Encoded xDS resources: each one packed once as a google.protobuf.Any, with a content hash that serves as its
// Delta version and lets a connection skip resending what the proxy already has.

import { createHash } from 'node:crypto';
import { type AnyMessage, messageType, packAny, typeUrl } from '../envoy-protos';
import { NAME_TABLE_TYPE } from '../xds-istio';

export const CLUSTER = 'envoy.config.cluster.v3.Cluster';
export const ENDPOINTS = 'envoy.config.endpoint.v3.ClusterLoadAssignment';
export const LISTENER = 'envoy.config.listener.v3.Listener';
export const ROUTE = 'envoy.config.route.v3.RouteConfiguration';
export const SECRET = 'envoy.extensions.transport_sockets.tls.v3.Secret';
export const EXTENSION_CONFIG = 'envoy.config.core.v3.TypedExtensionConfig';

export const TYPE_URLS = {
  cluster: typeUrl(CLUSTER),
  endpoint: typeUrl(ENDPOINTS),
  listener: typeUrl(LISTENER),
  route: typeUrl(ROUTE),
  /** SDS over ADS: credentialName Secrets (./gen-secrets.ts). */
  secret: typeUrl(SECRET),
  /** NDS, for the agent's DNS proxy (./gen-nametable.ts). */
  nameTable: NAME_TABLE_TYPE,
  /** ECDS: WasmPlugin filters (./gen-wasm.ts), asked for by name. */
  extensionConfig: typeUrl(EXTENSION_CONFIG),
} as const;

/** Push order that lets Envoy warm clusters before endpoints and listeners before routes. */
// Secrets last: Envoy asks for them while warming the clusters and listeners that name them.
// ECDS after the listeners whose filters name its resources, as istiod orders it.
export const PUSH_ORDER: readonly string[] = [
  TYPE_URLS.cluster,
  TYPE_URLS.endpoint,
  TYPE_URLS.listener,
  TYPE_URLS.route,
  TYPE_URLS.secret,
  TYPE_URLS.nameTable,
  TYPE_URLS.extensionConfig,
];

/** Types whose empty subscription means "everything" (wildcard). */
export const WILDCARD_TYPES: ReadonlySet<string> = new Set([
  TYPE_URLS.cluster,
  TYPE_URLS.listener,
  TYPE_URLS.nameTable,
]);

export interface Resource {
  readonly name: string;
  readonly any: AnyMessage;
  readonly hash: string;
}

export function encodeResource(fullName: string, name: string, obj: Record<string, unknown>): Resource {
  const any = packAny(fullName, obj);
  return Object.freeze({ name, any, hash: createHash('sha256').update(any.value).digest('base64url').slice(0, 16) });
}

/**
 * A RouteConfiguration encoded one virtual host per step, so a caller can give the event loop back in between
 * (10,000 virtual hosts on one port took a second in one go). The bytes are exactly those of a one-shot encode:
 * fields in number order, each virtual host as field 2 (tag 0x12, length, message).
 */
export function* encodeRouteConfigSteps(
  route: { name: string; virtual_hosts: readonly Record<string, unknown>[] } & Record<string, unknown>,
): Generator<void, Resource> {
  const { name, virtual_hosts: vhosts, ...rest } = route;
  const vhType = messageType('envoy.config.route.v3.VirtualHost');
  // Every other RouteConfiguration field is numbered above virtual_hosts (2), so it is encoded after them.
  const head = packAny(ROUTE, { name }).value;
  const tail = packAny(ROUTE, rest).value;
  const parts: Uint8Array[] = [head];
  for (const vh of vhosts) {
    const msg = vhType.fromObject(vh);
    const err = vhType.verify(msg);
    if (err) throw new Error(`invalid ${ROUTE}: virtual_hosts: ${err}`);
    const bytes = vhType.encode(msg).finish();
    parts.push(Uint8Array.of(0x12), varint(bytes.length), bytes);
    yield;
  }
  parts.push(tail);
  const value = Buffer.concat(parts);
  return Object.freeze({
    name,
    any: { type_url: typeUrl(ROUTE), value },
    hash: createHash('sha256').update(value).digest('base64url').slice(0, 16),
  });
}

function varint(n: number): Uint8Array {
  const out: number[] = [];
  while (n > 0x7f) {
    out.push((n & 0x7f) | 0x80);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return Uint8Array.from(out);
}

/**
 * Encoded resources carried from one push context to the next, keyed by the immutable inputs they were built
 * from (a Service, an instance list, a DestinationRule revision): the registry and the store replace those
 * objects only when they change, so an endpoint change re-encodes one service's resources, not all of them.
 */
export class ResourceCache {
  private readonly byObject = new WeakMap<object, Map<string, { variant: string; r: Resource }>>();

  /** The resource `name` built from `owner`; rebuilt when `variant` (what else it depends on) changes. */
  get(owner: object, name: string, variant: string, build: () => Resource): Resource {
    let m = this.byObject.get(owner);
    if (!m) this.byObject.set(owner, (m = new Map()));
    const hit = m.get(name);
    if (hit && hit.variant === variant) return hit.r;
    const r = build();
    m.set(name, { variant, r });
    return r;
  }
}

/** Duration message from milliseconds. */
export function dur(ms: number): { seconds: number; nanos: number } {
  const seconds = Math.floor(ms / 1000);
  return { seconds, nanos: Math.round((ms - seconds * 1000) * 1e6) };
}

export const ADS_SOURCE = Object.freeze({ ads: {}, resource_api_version: 'V3' });

export function clusterName(port: number, subset: string, host: string): string {
  return `outbound|${port}|${subset}|${host}`;
}

/** Hash of a set of resources, order-independent. */
export function setHash(resources: Iterable<Resource>): string {
  const parts = [...resources].map((r) => `${r.name}\u0000${r.hash}`).sort();
  return createHash('sha256').update(parts.join('\u0001')).digest('base64url').slice(0, 16);
}

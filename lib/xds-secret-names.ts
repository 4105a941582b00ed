// The SDS names (`file-cert:`/`file-root:`) that a listener or cluster from the control plane references: the
// `name` of every SdsSecretConfig in it (a transport socket's TLS context, and any Any that holds one). The xDS
// proxy calls this only for a resource whose bytes contain such a name at all, so a proxy whose config names no
// file pays one byte search per listener and cluster push.
//
// The walk reads the wire format guided by the resource's schema (lib/envoy-protos.ts), descending only into
// length-delimited fields whose type is a message: nothing is decoded into objects. An Any of a type the
// descriptor lacks is followed only for the transport-socket wrappers listed below (field numbers from Envoy's
// API); a name inside any other unknown type is not collected, so that secret is not served (refused, logged).

import type * as protobuf from 'protobufjs';
import { forEachField, unpackAnyBytes } from './xds-codec';
import { mayNameFile, namesFile } from './secret-names';

const SDS_SECRET_CONFIG = '.envoy.extensions.transport_sockets.tls.v3.SdsSecretConfig';
const ANY = '.google.protobuf.Any';
const WT_LEN = 2;
const MAX_DEPTH = 64;

const TS = 'envoy.config.core.v3.TransportSocket';
const DTLS = 'envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext';
const UTLS = 'envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext';
/** Wrappers of transport sockets that proto/envoy.json does not describe: type -> field number -> field type. */
const WRAPPERS: Record<string, Record<number, string>> = {
  'envoy.extensions.transport_sockets.internal_upstream.v3.InternalUpstreamTransport': { 3: TS },
  'envoy.extensions.transport_sockets.quic.v3.QuicDownstreamTransport': { 1: DTLS },
  'envoy.extensions.transport_sockets.quic.v3.QuicUpstreamTransport': { 1: UTLS },
  'envoy.extensions.transport_sockets.proxy_protocol.v3.ProxyProtocolUpstreamTransport': { 2: TS },
  'envoy.extensions.transport_sockets.http_11_proxy.v3.Http11ProxyUpstreamTransport': { 1: TS },
  'envoy.extensions.transport_sockets.tcp_stats.v3.Config': { 1: TS },
  'envoy.extensions.transport_sockets.tap.v3.Tap': { 2: TS },
  'envoy.extensions.transport_sockets.starttls.v3.StartTlsConfig': { 2: DTLS },
  'envoy.extensions.transport_sockets.starttls.v3.UpstreamStartTlsConfig': { 2: UTLS },
};

const types = new Map<string, protobuf.Type | undefined>();

function lookup(name: string): protobuf.Type | undefined {
  if (types.has(name)) return types.get(name);
  let t: protobuf.Type | undefined;
  try {
    // protobufjs and Envoy's descriptor load only here, for a config that names a file at all: a sidecar's start
    // (Envoy's first xDS stream waits for the proxy to load) never pays for them.
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    t = (require('./envoy-protos') as typeof import('./envoy-protos')).envoyRoot().lookupType(name);
  } catch {
    t = undefined;
  }
  // Bounded: only type URLs that occur inside resources naming a file get here, and the descriptor is finite.
  if (t || types.size < 1000) types.set(name, t);
  return t;
}

/** The field's message type, or undefined for scalars, strings, bytes and enums. */
function messageOf(field: protobuf.Field): protobuf.Type | undefined {
  if (!field.resolved) field.resolve();
  const t = field.resolvedType;
  return t && 'fieldsById' in t ? (t as protobuf.Type) : undefined;
}

function walk(type: protobuf.Type, buf: Buffer, out: Set<string>, depth: number): void {
  if (depth > MAX_DEPTH) return;
  if (type.fullName === SDS_SECRET_CONFIG) {
    forEachField(buf, (f, wt, b, s, e) => {
      if (f === 1 && wt === WT_LEN) out.add(b.toString('utf8', s, e));
    });
    return;
  }
  if (type.fullName === ANY) {
    if (!mayNameFile(buf)) return;
    const { typeUrl, value } = unpackAnyBytes(buf);
    const name = typeUrl.slice(typeUrl.lastIndexOf('/') + 1);
    const inner = lookup(name);
    if (inner) return walk(inner, value, out, depth + 1);
    const wrapper = WRAPPERS[name];
    if (!wrapper) return;
    forEachField(value, (f, wt, b, s, e) => {
      const t = wrapper[f] && wt === WT_LEN ? lookup(wrapper[f]) : undefined;
      if (t) walk(t, b.subarray(s, e), out, depth + 1);
    });
    return;
  }
  forEachField(buf, (f, wt, b, s, e) => {
    if (wt !== WT_LEN) return;
    const field = type.fieldsById[f];
    if (!field) return;
    const t = messageOf(field);
    if (!t) return;
    const sub = b.subarray(s, e);
    if (!mayNameFile(sub)) return;
    if (!(field as unknown as protobuf.MapField).keyType) return walk(t, sub, out, depth + 1);
    // A map entry on the wire: key = 1, value = 2.
    forEachField(sub, (ef, ewt, eb, es, ee) => {
      if (ef === 2 && ewt === WT_LEN) walk(t, eb.subarray(es, ee), out, depth + 1);
    });
  });
}

/**
 * The file SDS names in one resource (a google.protobuf.Any: a Listener, a Cluster, ...). Malformed bytes end the
 * walk with what was found so far (Envoy rejects such a resource anyway).
 */
export function fileSecretNames(any: Buffer): string[] {
  if (!mayNameFile(any)) return [];
  const out = new Set<string>();
  try {
    walk(lookup('google.protobuf.Any')!, any, out, 0);
  } catch {
    // see above
  }
  return [...out].filter(namesFile);
}

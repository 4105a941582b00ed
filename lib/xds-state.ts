// What Envoy has subscribed to and what it already holds, per type URL, learnt from the requests and responses
// that pass through the proxy. When the upstream stream is replaced, `resend()` gives the requests that bring a
// fresh control-plane stream to the same state without Envoy noticing: Envoy's own latest request for each type
// (SotW), or its current subscriptions with the versions of the resources it has ACKed (Delta).

import {
  DELTA_REQUEST_FIELDS,
  encodeDeltaRequest,
  nodeField,
  SOTW_REQUEST_FIELDS,
  withoutFields,
  type DeltaRequest,
  type DeltaResponse,
  type SotwRequest,
} from './xds-codec';

export type XdsKind = 'sotw' | 'delta';

export interface Resend {
  typeUrl: string;
  bytes: Buffer;
  /** SotW: the resource names the request carries, to recognise a later identical request. */
  names?: string;
}

const STRIP_SOTW = new Set<number>([SOTW_REQUEST_FIELDS.node, SOTW_REQUEST_FIELDS.nonce, SOTW_REQUEST_FIELDS.error]);

export const namesKey = (names: readonly string[]) => names.join('\n');

export class SotwSubscriptions {
  readonly kind = 'sotw' as const;
  node: Buffer | undefined;
  // Map order is first-seen order, which is the order Envoy subscribed in (CDS, EDS, LDS, RDS).
  private readonly last = new Map<string, { raw: Buffer; names: string }>();

  record(raw: Buffer, req: SotwRequest): void {
    if (req.node && !this.node) this.node = Buffer.from(req.node);
    // Copied: the message may be a view into a larger receive buffer that should not be kept alive.
    this.last.set(req.typeUrl, { raw: Buffer.from(raw), names: namesKey(req.resourceNames) });
  }

  types(): string[] {
    return [...this.last.keys()];
  }

  /** Envoy's latest request of one type without node, nonce and error: its names and the version it accepted. */
  latest(typeUrl: string): Buffer | undefined {
    const l = this.last.get(typeUrl);
    return l && withoutFields(l.raw, STRIP_SOTW);
  }

  /** Envoy's latest request of each type, without nonce and error (they belong to the old stream). */
  resend(): Resend[] {
    const out: Resend[] = [];
    for (const [typeUrl, { raw, names }] of this.last) {
      let bytes = withoutFields(raw, STRIP_SOTW);
      if (out.length === 0 && this.node) bytes = Buffer.concat([nodeField('sotw', this.node), bytes]);
      out.push({ typeUrl, bytes, names });
    }
    return out;
  }
}

interface DeltaTypeState {
  /** Envoy's first request named nothing: a wildcard subscription in the legacy form. */
  legacyWildcard: boolean;
  names: Set<string>;
  /** Resource versions Envoy has ACKed. */
  versions: Map<string, string>;
  /** Changes forwarded to Envoy, applied to `versions` when Envoy ACKs that nonce. */
  pending: Map<string, { upserts: Array<[string, string]>; removed: string[] }>;
}

const MAX_PENDING = 32;

export class DeltaSubscriptions {
  readonly kind = 'delta' as const;
  node: Buffer | undefined;
  private readonly state = new Map<string, DeltaTypeState>();

  /** Records a request from Envoy; returns whether it ACKed or NACKed a response the proxy forwarded. */
  record(req: DeltaRequest): 'ack' | 'nack' | undefined {
    if (req.node && !this.node) this.node = Buffer.from(req.node);
    let st = this.state.get(req.typeUrl);
    if (!st) {
      st = {
        legacyWildcard: req.subscribe.length === 0,
        names: new Set(),
        versions: new Map(req.initialVersions),
        pending: new Map(),
      };
      this.state.set(req.typeUrl, st);
    }
    for (const n of req.subscribe) st.names.add(n);
    for (const n of req.unsubscribe) {
      st.names.delete(n);
      st.versions.delete(n);
      if (n === '*') st.legacyWildcard = false;
    }
    if (!req.responseNonce) return undefined;
    const p = st.pending.get(req.responseNonce);
    if (!p) return undefined;
    st.pending.delete(req.responseNonce);
    if (req.errorDetail) return 'nack';
    for (const [n, v] of p.upserts) st.versions.set(n, v);
    for (const n of p.removed) st.versions.delete(n);
    return 'ack';
  }

  /** Remembers what a response forwarded to Envoy would change once Envoy ACKs it. */
  recordResponse(resp: DeltaResponse): void {
    const st = this.state.get(resp.typeUrl);
    if (!st) return;
    // One response may reach Envoy in parts under its nonce (a rewritten type, lib/xds-session.ts): they add up.
    const prev = st.pending.get(resp.nonce);
    const upserts = resp.resources.map((r): [string, string] => [r.name, r.version]);
    const removed = prev ? [...prev.removed, ...resp.removed] : resp.removed;
    st.pending.set(resp.nonce, { upserts: prev ? [...prev.upserts, ...upserts] : upserts, removed });
    // Envoy ACKs or NACKs every response; this only bounds memory if a nonce is never answered.
    if (st.pending.size > MAX_PENDING) st.pending.delete(st.pending.keys().next().value as string);
  }

  types(): string[] {
    return [...this.state.keys()];
  }

  versions(typeUrl: string): ReadonlyMap<string, string> | undefined {
    return this.state.get(typeUrl)?.versions;
  }

  subscribed(typeUrl: string): string[] {
    const st = this.state.get(typeUrl);
    if (!st) return [];
    return st.legacyWildcard ? ['*', ...[...st.names].filter((n) => n !== '*')] : [...st.names];
  }

  /** One request per type: the current subscriptions and the versions Envoy holds. */
  resend(): Resend[] {
    const out: Resend[] = [];
    for (const [typeUrl, st] of this.state) {
      let subscribe: string[];
      if (st.legacyWildcard) subscribe = st.names.size ? ['*', ...[...st.names].filter((n) => n !== '*')] : [];
      else if (st.names.size) subscribe = [...st.names];
      else continue; // subscribed to nothing: an empty first request would mean "everything"
      const node = out.length === 0 ? this.node : undefined;
      out.push({ typeUrl, bytes: encodeDeltaRequest({ node, typeUrl, subscribe, initialVersions: st.versions }) });
    }
    return out;
  }
}

export type Subscriptions = SotwSubscriptions | DeltaSubscriptions;

/** Nonces the current upstream stream has issued, per type (the last few), to spot ACKs meant for an older stream. */
export class IssuedNonces {
  private readonly byType = new Map<string, string[]>();
  add(typeUrl: string, nonce: string): void {
    let l = this.byType.get(typeUrl);
    if (!l) this.byType.set(typeUrl, (l = []));
    l.push(nonce);
    if (l.length > 16) l.shift();
  }
  has(typeUrl: string, nonce: string): boolean {
    return this.byType.get(typeUrl)?.includes(nonce) ?? false;
  }
}

export const STRIP_STALE: Record<XdsKind, ReadonlySet<number>> = {
  sotw: new Set([SOTW_REQUEST_FIELDS.nonce, SOTW_REQUEST_FIELDS.error]),
  delta: new Set([DELTA_REQUEST_FIELDS.nonce, DELTA_REQUEST_FIELDS.error]),
};

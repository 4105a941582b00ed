// One ADS stream (state of the world or Delta): what the proxy subscribed to per type, what it was sent (nonce,
// version, per-resource hashes), what it ACKed and NACKed. Requests and pushes run one at a time, in arrival
// order; pushes that queue up behind each other merge into one, always built from the newest push context.

import { scope } from '../log';
import { emptyEndpoints } from './gen-clusters';
import { generate, SUPPORTED_TYPES } from './generate';
import type { Proxy } from './proxy';
import type { PushContext } from './push-context';
import { PUSH_ORDER, type Resource, setHash, TYPE_URLS, WILDCARD_TYPES } from './resources';

const log = scope('discovery');

export interface SotwRequest {
  version_info?: string;
  node?: { id?: string; metadata?: unknown };
  resource_names?: string[];
  type_url?: string;
  response_nonce?: string;
  error_detail?: { code?: number; message?: string };
}

export interface DeltaRequest {
  node?: { id?: string; metadata?: unknown };
  type_url?: string;
  resource_names_subscribe?: string[];
  resource_names_unsubscribe?: string[];
  initial_resource_versions?: Record<string, string>;
  response_nonce?: string;
  error_detail?: { code?: number; message?: string };
}

export interface Nack {
  proxy: string;
  typeUrl: string;
  /** Resources the error names; empty when it names none (then the whole response is taken as rejected). */
  names: string[];
  version: string;
  detail: string;
  at: number;
}

export interface ConnectionHost {
  current(): PushContext;
  /** Writes one response; resolves once the stream can take more. */
  write(conn: AdsConnection, msg: Record<string, unknown>): Promise<void>;
  limit<T>(fn: () => Promise<T>): Promise<T>;
  onNack(n: Nack): void;
  onPushed(conn: AdsConnection, version: string, ms: number): void;
}

interface Sent {
  nonce: string;
  version: string;
  /** name -> hash of every resource in the response. */
  resources: Map<string, Resource>;
  /** Delta: the hash the client had before this response (undefined: none), to restore on NACK. */
  previous: Map<string, string | undefined>;
  setHash: string;
}

class Watch {
  wildcard = false;
  readonly names = new Set<string>();
  /** name -> hash the proxy is believed to hold. */
  readonly has = new Map<string, string>();
  /** SotW: the last accepted resources, sent again in place of a NACKed newer version. */
  accepted = new Map<string, Resource>();
  /** name -> hash the proxy rejected; not sent again until the resource changes. */
  readonly nacked = new Map<string, string>();
  /** SotW: hash of a whole response rejected without naming a resource. */
  nackedSet: string | undefined;
  last: Sent | undefined;
  ackedVersion: string | undefined;
}

let nextConnId = 0;

export class AdsConnection {
  readonly id: string;
  private readonly watches = new Map<string, Watch>();
  private tail: Promise<void> = Promise.resolve();
  private pushQueued = false;
  private closed = false;
  private nonceSeq = 0;

  constructor(
    readonly proxy: Proxy,
    readonly delta: boolean,
    private readonly host: ConnectionHost,
  ) {
    this.id = `${proxy.id}-${++nextConnId}`;
  }

  /** Types the proxy subscribed to, with the version it last ACKed. */
  subscriptions(): { typeUrl: string; acked?: string; sent?: string; resources: number }[] {
    return [...this.watches].map(([typeUrl, w]) => ({
      typeUrl,
      acked: w.ackedVersion,
      sent: w.last?.version,
      resources: w.has.size,
    }));
  }

  close(): void {
    this.closed = true;
  }

  onSotwRequest(req: SotwRequest): void {
    this.enqueue(() => this.handleSotw(req));
  }

  onDeltaRequest(req: DeltaRequest): void {
    this.enqueue(() => this.handleDelta(req));
  }

  /** Schedules a push of every subscribed type; merges with a push already waiting. */
  push(): void {
    if (this.pushQueued || this.closed) return;
    this.pushQueued = true;
    this.enqueue(async () => {
      this.pushQueued = false;
      await this.host.limit(async () => {
        const push = this.host.current();
        const t0 = performance.now();
        for (const type of PUSH_ORDER) {
          const w = this.watches.get(type);
          if (!w || this.closed) continue;
          if (this.delta) await this.sendDelta(push, type, w, false, []);
          else await this.sendSotw(push, type, w, false);
        }
        this.host.onPushed(this, push.version, performance.now() - t0);
      });
    });
  }

  private enqueue(fn: () => Promise<void>): void {
    this.tail = this.tail.then(async () => {
      if (this.closed) return;
      try {
        await fn();
      } catch (e) {
        log.error('xDS connection failed to handle a request or push', {
          proxy: this.proxy.id,
          error: (e as Error).stack ?? String(e),
        });
      }
    });
  }

  private nonce(): string {
    return `${this.id}-${++this.nonceSeq}`;
  }

  // ---- state of the world ----

  private async handleSotw(req: SotwRequest): Promise<void> {
    const type = req.type_url ?? '';
    if (!SUPPORTED_TYPES.has(type)) {
      log.debug('ignoring a request for a type this server does not serve', { proxy: this.proxy.id, type });
      return;
    }
    const names = (req.resource_names ?? []).filter((n) => n !== '*');
    let w = this.watches.get(type);
    if (!w || !req.response_nonce) {
      // A new subscription, or the first request after a reconnect: answer it whatever the proxy had.
      w ??= new Watch();
      this.watches.set(type, w);
      w.wildcard = (WILDCARD_TYPES.has(type) && names.length === 0) || (req.resource_names ?? []).includes('*');
      setNames(w.names, names);
      return this.sendSotw(this.host.current(), type, w, true);
    }
    if (req.response_nonce !== w.last?.nonce) return; // answers an older response; a newer one is on its way
    if (req.error_detail) return this.recordNack(type, w, req.error_detail.message ?? '');
    w.ackedVersion = req.version_info;
    w.accepted = new Map(w.last.resources);
    if (!w.wildcard && !sameSet(w.names, names)) {
      setNames(w.names, names);
      await this.sendSotw(this.host.current(), type, w, true);
    }
  }

  private async sendSotw(push: PushContext, type: string, w: Watch, requested: boolean): Promise<void> {
    const all = generate(push, this.proxy, type, w.names);
    const chosen: Resource[] = [];
    const pick = (r: Resource) => {
      if (w.nacked.get(r.name) === r.hash) {
        const prev = w.accepted.get(r.name);
        if (prev) chosen.push(prev);
        return;
      }
      w.nacked.delete(r.name);
      chosen.push(r);
    };
    if (w.wildcard) for (const r of all.values()) pick(r);
    else {
      for (const n of w.names) {
        const r = all.get(n) ?? (type === TYPE_URLS.endpoint ? emptyEndpoints(n) : undefined);
        if (r) pick(r);
      }
    }
    const h = setHash(chosen);
    if (!requested && (h === w.last?.setHash || h === w.nackedSet)) return;
    const nonce = this.nonce();
    // Envoy warms an updated EDS cluster until its endpoints come again: the next EDS step re-sends them.
    const eds = type === TYPE_URLS.cluster ? this.watches.get(TYPE_URLS.endpoint) : undefined;
    if (
      eds?.last &&
      chosen.some((r) => {
        const old = w.last?.resources.get(r.name);
        return old !== undefined && old.hash !== r.hash;
      })
    )
      eds.last.setHash = '';
    w.last = {
      nonce,
      version: push.version,
      resources: new Map(chosen.map((r) => [r.name, r])),
      previous: new Map(),
      setHash: h,
    };
    for (const n of [...w.has.keys()]) if (!w.last.resources.has(n)) w.has.delete(n);
    for (const r of chosen) w.has.set(r.name, r.hash);
    await this.host.write(this, {
      version_info: push.version,
      resources: chosen.map((r) => r.any),
      type_url: type,
      nonce,
    });
  }

  // ---- delta ----

  private async handleDelta(req: DeltaRequest): Promise<void> {
    const type = req.type_url ?? '';
    if (!SUPPORTED_TYPES.has(type)) {
      log.debug('ignoring a request for a type this server does not serve', { proxy: this.proxy.id, type });
      return;
    }
    const subscribe = req.resource_names_subscribe ?? [];
    const unsubscribe = req.resource_names_unsubscribe ?? [];
    let w = this.watches.get(type);
    const isNew = !w;
    if (!w) {
      w = new Watch();
      this.watches.set(type, w);
      w.wildcard = WILDCARD_TYPES.has(type) && subscribe.length === 0;
      for (const [n, v] of Object.entries(req.initial_resource_versions ?? {})) w.has.set(n, v);
    }
    if (req.response_nonce && req.response_nonce === w.last?.nonce) {
      if (req.error_detail) this.recordNack(type, w, req.error_detail.message ?? '');
      else w.ackedVersion = w.last.version;
    }
    for (const n of subscribe) {
      if (n === '*') w.wildcard = true;
      else w.names.add(n);
      // Subscribing again to something it holds asks for it again; on a new stream, initial versions say what it holds.
      if (!isNew) w.has.delete(n);
    }
    for (const n of unsubscribe) {
      if (n === '*') w.wildcard = false;
      else {
        w.names.delete(n);
        w.has.delete(n);
      }
    }
    if (isNew || subscribe.length) await this.sendDelta(this.host.current(), type, w, isNew, subscribe);
  }

  private async sendDelta(
    push: PushContext,
    type: string,
    w: Watch,
    always: boolean,
    requested: string[],
  ): Promise<void> {
    const all = generate(push, this.proxy, type, w.names);
    const desired = w.wildcard
      ? all
      : new Map(
          [...w.names].flatMap((n) => {
            const r = all.get(n);
            return r ? [[n, r] as const] : [];
          }),
        );
    const changed: Resource[] = [];
    for (const r of desired.values()) {
      if (w.has.get(r.name) === r.hash) continue;
      if (w.nacked.get(r.name) === r.hash) continue;
      w.nacked.delete(r.name);
      changed.push(r);
    }
    const removed: string[] = [];
    for (const n of w.has.keys()) if (!desired.has(n)) removed.push(n);
    // Names asked for that do not exist are answered as removed, so the proxy stops waiting for them.
    for (const n of requested) if (n !== '*' && !desired.has(n) && !removed.includes(n)) removed.push(n);
    if (!always && !changed.length && !removed.length) return;
    const nonce = this.nonce();
    const previous = new Map<string, string | undefined>();
    for (const r of changed) {
      previous.set(r.name, w.has.get(r.name));
      w.has.set(r.name, r.hash);
    }
    // Envoy warms an updated EDS cluster until its endpoints come again: re-send them in this push.
    const eds = type === TYPE_URLS.cluster ? this.watches.get(TYPE_URLS.endpoint) : undefined;
    if (eds) for (const r of changed) if (previous.get(r.name) !== undefined) eds.has.delete(r.name);
    for (const n of removed) {
      previous.set(n, w.has.get(n));
      w.has.delete(n);
    }
    w.last = {
      nonce,
      version: push.version,
      resources: new Map(changed.map((r) => [r.name, r])),
      previous,
      setHash: '',
    };
    await this.host.write(this, {
      system_version_info: push.version,
      resources: changed.map((r) => ({ name: r.name, version: r.hash, resource: r.any })),
      type_url: type,
      removed_resources: removed,
      nonce,
    });
  }

  // ---- NACKs ----

  private recordNack(type: string, w: Watch, detail: string): void {
    const last = w.last;
    if (!last) return;
    const names = [...last.resources.keys()].filter((n) => mentions(detail, n));
    const rejected = names.length ? names : [...last.resources.keys()];
    if (this.delta || names.length) {
      for (const n of rejected) w.nacked.set(n, last.resources.get(n)!.hash);
    } else {
      w.nackedSet = last.setHash;
    }
    if (this.delta) {
      // The proxy kept what it had before this response.
      for (const n of rejected) {
        const prev = last.previous.get(n);
        if (prev === undefined) w.has.delete(n);
        else w.has.set(n, prev);
      }
    }
    this.host.onNack({ proxy: this.proxy.id, typeUrl: type, names, version: last.version, detail, at: Date.now() });
  }
}

/** Does an Envoy error message name this resource (not just contain it inside a longer name)? */
function mentions(detail: string, name: string): boolean {
  let i = detail.indexOf(name);
  while (i >= 0) {
    const before = detail[i - 1];
    const after = detail[i + name.length];
    if ((before === undefined || !/[\w|.:-]/.test(before)) && (after === undefined || !/[\w|.-]/.test(after)))
      return true;
    i = detail.indexOf(name, i + 1);
  }
  return false;
}

function sameSet(a: ReadonlySet<string>, b: readonly string[]): boolean {
  if (a.size !== new Set(b).size) return false;
  return b.every((x) => a.has(x));
}

function setNames(target: Set<string>, names: readonly string[]): void {
  target.clear();
  for (const n of names) target.add(n);
}

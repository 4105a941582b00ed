// A "lite" protobuf codec for the xDS envelopes: it reads and writes only the top-level fields of
// (Delta)DiscoveryRequest/Response that the proxy acts on, and never looks inside a resource's Any.
// Field numbers are those of envoy.service.discovery.v3 (discovery.proto) and google.rpc.Status.

import { AgentError } from './errors';

export const TYPE_PREFIX = 'type.googleapis.com/';
export const LISTENER_TYPE = `${TYPE_PREFIX}envoy.config.listener.v3.Listener`;

// DiscoveryRequest
const RQ_VERSION = 1,
  RQ_NODE = 2,
  RQ_NAMES = 3,
  RQ_TYPE = 4,
  RQ_NONCE = 5,
  RQ_ERROR = 6;
// DiscoveryResponse
const RS_VERSION = 1,
  RS_RESOURCES = 2,
  RS_TYPE = 4,
  RS_NONCE = 5;
// DeltaDiscoveryRequest
const DQ_NODE = 1,
  DQ_TYPE = 2,
  DQ_SUB = 3,
  DQ_UNSUB = 4,
  DQ_INITIAL = 5,
  DQ_NONCE = 6,
  DQ_ERROR = 7;
// DeltaDiscoveryResponse and its Resource
const DS_VERSION = 1,
  DS_RESOURCES = 2,
  DS_TYPE = 4,
  DS_NONCE = 5,
  DS_REMOVED = 6;
const RES_VERSION = 1,
  RES_ANY = 2,
  RES_NAME = 3;

const WT_VARINT = 0,
  WT_I64 = 1,
  WT_LEN = 2,
  WT_I32 = 5;

export interface ErrorDetail {
  code: number;
  message: string;
}

export interface SotwRequest {
  versionInfo: string;
  /** The Node message's bytes (without tag), present on the first request of a stream. */
  node?: Buffer;
  resourceNames: string[];
  typeUrl: string;
  responseNonce: string;
  errorDetail?: ErrorDetail;
}

export interface SotwResponse {
  versionInfo: string;
  typeUrl: string;
  nonce: string;
  resourceCount: number;
}

export interface DeltaRequest {
  node?: Buffer;
  typeUrl: string;
  subscribe: string[];
  unsubscribe: string[];
  initialVersions: Map<string, string>;
  responseNonce: string;
  errorDetail?: ErrorDetail;
}

export interface DeltaResource {
  name: string;
  version: string;
  /** The resource's google.protobuf.Any bytes (a view into the message, not a copy); absent for a removal marker. */
  any?: Buffer;
}

export interface DeltaResponse {
  systemVersionInfo: string;
  typeUrl: string;
  nonce: string;
  resources: DeltaResource[];
  removed: string[];
}

function bad(why: string): AgentError {
  return new AgentError('BAD_INPUT', why);
}

type FieldVisitor = (field: number, wireType: number, buf: Buffer, start: number, end: number, varint: number) => void;

/** Walks the top-level fields of one message; throws BAD_INPUT on anything that is not valid wire format. */
export function forEachField(buf: Buffer, visit: FieldVisitor, what = 'message'): void {
  let pos = 0;
  const len = buf.length;
  const varint = (): number => {
    let result = 0;
    let mul = 1;
    for (let i = 0; i < 10; i++) {
      if (pos >= len) throw bad(`${what}: truncated varint at byte ${pos}`);
      const b = buf[pos++]!;
      // Values above 2^53 lose precision; they only occur in fields the proxy skips.
      result += (b & 0x7f) * mul;
      if (b < 0x80) return result;
      mul *= 128;
    }
    throw bad(`${what}: varint longer than 10 bytes at byte ${pos}`);
  };
  while (pos < len) {
    const tagAt = pos;
    const tag = varint();
    const field = Math.floor(tag / 8);
    const wt = tag % 8;
    if (field === 0) throw bad(`${what}: field number 0 at byte ${tagAt}`);
    switch (wt) {
      case WT_VARINT: {
        const v = varint();
        visit(field, wt, buf, pos, pos, v);
        break;
      }
      case WT_I64:
        if (pos + 8 > len) throw bad(`${what}: truncated fixed64 field ${field} at byte ${tagAt}`);
        visit(field, wt, buf, pos, pos + 8, 0);
        pos += 8;
        break;
      case WT_I32:
        if (pos + 4 > len) throw bad(`${what}: truncated fixed32 field ${field} at byte ${tagAt}`);
        visit(field, wt, buf, pos, pos + 4, 0);
        pos += 4;
        break;
      case WT_LEN: {
        const n = varint();
        if (pos + n > len)
          throw bad(`${what}: field ${field} claims ${n} bytes but only ${len - pos} remain (byte ${tagAt})`);
        visit(field, wt, buf, pos, pos + n, 0);
        pos += n;
        break;
      }
      default:
        throw bad(`${what}: unsupported wire type ${wt} for field ${field} at byte ${tagAt}`);
    }
  }
}

function expectLen(field: number, wt: number, what: string): void {
  if (wt !== WT_LEN) throw bad(`${what}: field ${field} has wire type ${wt}, want length-delimited`);
}

function str(buf: Buffer, start: number, end: number): string {
  return buf.toString('utf8', start, end);
}

function parseStatus(buf: Buffer): ErrorDetail {
  const out: ErrorDetail = { code: 0, message: '' };
  forEachField(
    buf,
    (f, wt, b, s, e, v) => {
      if (f === 1 && wt === WT_VARINT) out.code = v > 0x7fffffff ? v - 0x100000000 : v;
      else if (f === 2 && wt === WT_LEN) out.message = str(b, s, e);
    },
    'google.rpc.Status',
  );
  return out;
}

export function parseSotwRequest(buf: Buffer): SotwRequest {
  const what = 'DiscoveryRequest';
  const r: SotwRequest = { versionInfo: '', resourceNames: [], typeUrl: '', responseNonce: '' };
  forEachField(
    buf,
    (f, wt, b, s, e) => {
      switch (f) {
        case RQ_VERSION:
          expectLen(f, wt, what);
          r.versionInfo = str(b, s, e);
          break;
        case RQ_NODE:
          expectLen(f, wt, what);
          r.node = b.subarray(s, e);
          break;
        case RQ_NAMES:
          expectLen(f, wt, what);
          r.resourceNames.push(str(b, s, e));
          break;
        case RQ_TYPE:
          expectLen(f, wt, what);
          r.typeUrl = str(b, s, e);
          break;
        case RQ_NONCE:
          expectLen(f, wt, what);
          r.responseNonce = str(b, s, e);
          break;
        case RQ_ERROR:
          expectLen(f, wt, what);
          r.errorDetail = parseStatus(b.subarray(s, e));
          break;
      }
    },
    what,
  );
  return r;
}

export function parseSotwResponse(buf: Buffer): SotwResponse {
  const what = 'DiscoveryResponse';
  const r: SotwResponse = { versionInfo: '', typeUrl: '', nonce: '', resourceCount: 0 };
  forEachField(
    buf,
    (f, wt, b, s, e) => {
      switch (f) {
        case RS_VERSION:
          expectLen(f, wt, what);
          r.versionInfo = str(b, s, e);
          break;
        case RS_RESOURCES:
          expectLen(f, wt, what);
          r.resourceCount++;
          break;
        case RS_TYPE:
          expectLen(f, wt, what);
          r.typeUrl = str(b, s, e);
          break;
        case RS_NONCE:
          expectLen(f, wt, what);
          r.nonce = str(b, s, e);
          break;
      }
    },
    what,
  );
  return r;
}

/** The Any bytes of each resource of a DiscoveryResponse, as views into buf. */
export function sotwResources(buf: Buffer): Buffer[] {
  const out: Buffer[] = [];
  forEachField(
    buf,
    (f, wt, b, s, e) => {
      if (f === RS_RESOURCES && wt === WT_LEN) out.push(b.subarray(s, e));
    },
    'DiscoveryResponse',
  );
  return out;
}

function parseMapEntry(buf: Buffer): [string, string] {
  let k = '';
  let v = '';
  forEachField(
    buf,
    (f, wt, b, s, e) => {
      if (f === 1 && wt === WT_LEN) k = str(b, s, e);
      else if (f === 2 && wt === WT_LEN) v = str(b, s, e);
    },
    'map entry',
  );
  return [k, v];
}

export function parseDeltaRequest(buf: Buffer): DeltaRequest {
  const what = 'DeltaDiscoveryRequest';
  const r: DeltaRequest = {
    typeUrl: '',
    subscribe: [],
    unsubscribe: [],
    initialVersions: new Map(),
    responseNonce: '',
  };
  forEachField(
    buf,
    (f, wt, b, s, e) => {
      switch (f) {
        case DQ_NODE:
          expectLen(f, wt, what);
          r.node = b.subarray(s, e);
          break;
        case DQ_TYPE:
          expectLen(f, wt, what);
          r.typeUrl = str(b, s, e);
          break;
        case DQ_SUB:
          expectLen(f, wt, what);
          r.subscribe.push(str(b, s, e));
          break;
        case DQ_UNSUB:
          expectLen(f, wt, what);
          r.unsubscribe.push(str(b, s, e));
          break;
        case DQ_INITIAL: {
          expectLen(f, wt, what);
          const [k, v] = parseMapEntry(b.subarray(s, e));
          r.initialVersions.set(k, v);
          break;
        }
        case DQ_NONCE:
          expectLen(f, wt, what);
          r.responseNonce = str(b, s, e);
          break;
        case DQ_ERROR:
          expectLen(f, wt, what);
          r.errorDetail = parseStatus(b.subarray(s, e));
          break;
      }
    },
    what,
  );
  return r;
}

function parseDeltaResource(buf: Buffer): DeltaResource {
  const r: DeltaResource = { name: '', version: '' };
  forEachField(
    buf,
    (f, wt, b, s, e) => {
      if (wt !== WT_LEN) return;
      if (f === RES_NAME) r.name = str(b, s, e);
      else if (f === RES_VERSION) r.version = str(b, s, e);
      else if (f === RES_ANY) r.any = b.subarray(s, e);
    },
    'Resource',
  );
  return r;
}

/** Reads each Resource's name and version (not its Any). */
export function parseDeltaResponse(buf: Buffer): DeltaResponse {
  const what = 'DeltaDiscoveryResponse';
  const r: DeltaResponse = { systemVersionInfo: '', typeUrl: '', nonce: '', resources: [], removed: [] };
  forEachField(
    buf,
    (f, wt, b, s, e) => {
      switch (f) {
        case DS_VERSION:
          expectLen(f, wt, what);
          r.systemVersionInfo = str(b, s, e);
          break;
        case DS_RESOURCES:
          expectLen(f, wt, what);
          r.resources.push(parseDeltaResource(b.subarray(s, e)));
          break;
        case DS_TYPE:
          expectLen(f, wt, what);
          r.typeUrl = str(b, s, e);
          break;
        case DS_NONCE:
          expectLen(f, wt, what);
          r.nonce = str(b, s, e);
          break;
        case DS_REMOVED:
          expectLen(f, wt, what);
          r.removed.push(str(b, s, e));
          break;
      }
    },
    what,
  );
  return r;
}

/** The Node's id (field 1), for logs and /debug/xds. */
export function nodeId(node: Buffer | undefined): string {
  let id = '';
  if (!node) return id;
  try {
    forEachField(
      node,
      (f, wt, b, s, e) => {
        if (f === 1 && wt === WT_LEN) id = str(b, s, e);
      },
      'Node',
    );
  } catch {
    return '';
  }
  return id;
}

/** google.protobuf.Any: type_url = 1, value = 2. */
export function unpackAnyBytes(any: Buffer): { typeUrl: string; value: Buffer } {
  const out: { typeUrl: string; value: Buffer } = { typeUrl: '', value: Buffer.alloc(0) };
  forEachField(
    any,
    (f, wt, b, s, e) => {
      if (f === 1 && wt === WT_LEN) out.typeUrl = str(b, s, e);
      else if (f === 2 && wt === WT_LEN) out.value = b.subarray(s, e);
    },
    'google.protobuf.Any',
  );
  return out;
}

/** A copy of buf without the given top-level fields; everything else keeps its bytes and order. */
export function withoutFields(buf: Buffer, fields: ReadonlySet<number>): Buffer {
  const keep: Buffer[] = [];
  let from = 0;
  let cut = false;
  let fieldStart = 0;
  // The visitor learns where a field's value ends; the field starts where the previous one ended.
  forEachField(buf, (f, _wt, _b, _s, e) => {
    if (fields.has(f)) {
      if (fieldStart > from) keep.push(buf.subarray(from, fieldStart));
      from = e;
      cut = true;
    }
    fieldStart = e;
  });
  if (!cut) return buf;
  if (from < buf.length) keep.push(buf.subarray(from));
  return Buffer.concat(keep);
}

// ---- writing ----

function varintBytes(n: number): number[] {
  const out: number[] = [];
  while (n >= 0x80) {
    out.push((n % 128) | 0x80);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return out;
}

/** Writes protobuf fields in the order they are added (also used by lib/ca-protos.ts). */
export class Writer {
  private parts: Buffer[] = [];
  lenField(field: number, value: Buffer): this {
    this.parts.push(Buffer.from([...varintBytes(field * 8 + WT_LEN), ...varintBytes(value.length)]), value);
    return this;
  }
  string(field: number, value: string | undefined): this {
    if (value) this.lenField(field, Buffer.from(value, 'utf8'));
    return this;
  }
  varint(field: number, value: number): this {
    if (value) this.parts.push(Buffer.from([...varintBytes(field * 8 + WT_VARINT), ...varintBytes(value)]));
    return this;
  }
  /** A message field: written even when empty (a oneof member must be present to be chosen). */
  message(field: number, value: Buffer): this {
    return this.lenField(field, value);
  }
  finish(): Buffer {
    return Buffer.concat(this.parts);
  }
}

function encodeStatus(e: ErrorDetail): Buffer {
  // A negative int32 as its low 32 bits: decoders truncate int32 varints to 32 bits.
  return new Writer()
    .varint(1, e.code >>> 0)
    .string(2, e.message)
    .finish();
}

/** The tag and length of a Node field, to put in front of a message that lacks one (concatenation merges). */
export function nodeField(kind: 'sotw' | 'delta', node: Buffer): Buffer {
  return new Writer().lenField(kind === 'sotw' ? RQ_NODE : DQ_NODE, node).finish();
}

export function encodeSotwRequest(r: Partial<SotwRequest> & { typeUrl: string }): Buffer {
  const w = new Writer().string(RQ_VERSION, r.versionInfo);
  if (r.node) w.lenField(RQ_NODE, r.node);
  for (const n of r.resourceNames ?? []) w.lenField(RQ_NAMES, Buffer.from(n, 'utf8'));
  w.string(RQ_TYPE, r.typeUrl).string(RQ_NONCE, r.responseNonce);
  if (r.errorDetail) w.lenField(RQ_ERROR, encodeStatus(r.errorDetail));
  return w.finish();
}

export function encodeDeltaRequest(r: Partial<DeltaRequest> & { typeUrl: string }): Buffer {
  const w = new Writer();
  if (r.node) w.lenField(DQ_NODE, r.node);
  w.string(DQ_TYPE, r.typeUrl);
  for (const n of r.subscribe ?? []) w.lenField(DQ_SUB, Buffer.from(n, 'utf8'));
  for (const n of r.unsubscribe ?? []) w.lenField(DQ_UNSUB, Buffer.from(n, 'utf8'));
  for (const [k, v] of r.initialVersions ?? []) w.lenField(DQ_INITIAL, new Writer().string(1, k).string(2, v).finish());
  w.string(DQ_NONCE, r.responseNonce);
  if (r.errorDetail) w.lenField(DQ_ERROR, encodeStatus(r.errorDetail));
  return w.finish();
}

/** google.protobuf.Any: type_url = 1, value = 2. */
export function packAnyBytes(typeUrl: string, value: Buffer): Buffer {
  return new Writer().string(1, typeUrl).lenField(2, value).finish();
}

/** A DiscoveryResponse from resources already packed as Any bytes (the SDS server's answers). */
export function encodeSotwResponse(r: {
  versionInfo: string;
  resources: Buffer[];
  typeUrl: string;
  nonce: string;
}): Buffer {
  const w = new Writer().string(RS_VERSION, r.versionInfo);
  for (const any of r.resources) w.message(RS_RESOURCES, any);
  return w.string(RS_TYPE, r.typeUrl).string(RS_NONCE, r.nonce).finish();
}

/** A DeltaDiscoveryResponse; each resource's Any is already packed. */
export function encodeDeltaResponse(r: {
  systemVersionInfo: string;
  resources: { name: string; version: string; any: Buffer }[];
  typeUrl: string;
  nonce: string;
  removed?: string[];
}): Buffer {
  const w = new Writer().string(DS_VERSION, r.systemVersionInfo);
  for (const res of r.resources) {
    const resource = new Writer().string(RES_VERSION, res.version).message(RES_ANY, res.any).string(RES_NAME, res.name);
    w.message(DS_RESOURCES, resource.finish());
  }
  w.string(DS_TYPE, r.typeUrl).string(DS_NONCE, r.nonce);
  for (const n of r.removed ?? []) w.lenField(DS_REMOVED, Buffer.from(n, 'utf8'));
  return w.finish();
}

/** A DiscoveryResponse with its resources replaced by `anys`; every other field keeps its bytes. */
export function withSotwResources(buf: Buffer, anys: readonly Buffer[]): Buffer {
  const w = new Writer();
  const parts: Buffer[] = [];
  let from = 0;
  forEachField(
    buf,
    (f, _wt, b, _s, e) => {
      if (f !== RS_RESOURCES) parts.push(b.subarray(from, e));
      from = e;
    },
    'DiscoveryResponse',
  );
  for (const a of anys) w.lenField(RS_RESOURCES, a);
  return Buffer.concat([...parts, w.finish()]);
}

/**
 * A DeltaDiscoveryResponse whose n-th Resource that carries an Any gets `anys[n]` instead (undefined: that Resource
 * is left out), and whose removed names are those `keepRemoved` keeps; every other byte as it came.
 */
export function withDeltaResources(
  buf: Buffer,
  anys: ReadonlyArray<Buffer | undefined>,
  keepRemoved: (name: string) => boolean,
): Buffer {
  const parts: Buffer[] = [];
  let from = 0;
  let n = 0;
  forEachField(
    buf,
    (f, wt, b, s, e) => {
      const raw = b.subarray(from, e);
      from = e;
      if (f === DS_REMOVED && wt === WT_LEN) {
        if (keepRemoved(str(b, s, e))) parts.push(raw);
        return;
      }
      if (f !== DS_RESOURCES || wt !== WT_LEN) return void parts.push(raw);
      const res = b.subarray(s, e);
      if (parseDeltaResource(res).any === undefined) return void parts.push(raw);
      const replacement = anys[n++];
      if (!replacement) return;
      const inner: Buffer[] = [];
      let at = 0;
      forEachField(
        res,
        (rf, _rwt, rb, _rs, re) => {
          if (rf !== RES_ANY) inner.push(rb.subarray(at, re));
          at = re;
        },
        'Resource',
      );
      inner.push(new Writer().lenField(RES_ANY, replacement).finish());
      parts.push(new Writer().lenField(DS_RESOURCES, Buffer.concat(inner)).finish());
    },
    'DeltaDiscoveryResponse',
  );
  return Buffer.concat(parts);
}

/** Field numbers the proxy strips from a request when it re-sends or re-targets it. */
export const SOTW_REQUEST_FIELDS = { node: RQ_NODE, nonce: RQ_NONCE, error: RQ_ERROR } as const;
export const DELTA_REQUEST_FIELDS = { node: DQ_NODE, nonce: DQ_NONCE, error: DQ_ERROR } as const;

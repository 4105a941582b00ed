// DNS wire helpers for the proxy (pure): error replies, the client's size limit, truncation with TC, and a framing
// check. Messages are decoded and encoded by `dns-packet`; it is lenient about record lengths (an A record whose
// RDLENGTH runs past the packet decodes to a made-up address), so `wellFormed` walks the framing first: names
// (labels, and compression pointers only backwards, so no loop), fixed fields, and every RDLENGTH inside the packet.

import * as dnsPacket from 'dns-packet';

export const HEADER = 12;
export const MIN_UDP = 512;
export const MAX_TCP = 65535;
export const RCODE = { NOERROR: 0, FORMERR: 1, SERVFAIL: 2, NOTIMP: 4 } as const;
export const F = { QR: 0x8000, AA: 0x0400, TC: 0x0200, RD: 0x0100, RA: 0x0080, CD: 0x0010 } as const;

export interface Question {
  name: string;
  type: string;
  class?: string;
}

export type Proto = 'udp' | 'tcp';

/** Offset after the name at `o`, or -1. Pointers must point backwards (no loops); at most 255 bytes of name. */
function skipName(buf: Buffer, o: number): number {
  let total = 0;
  while (o < buf.length) {
    const len = buf[o]!;
    if (len === 0) return o + 1;
    if ((len & 0xc0) === 0xc0) {
      if (o + 2 > buf.length) return -1;
      const target = buf.readUInt16BE(o) & 0x3fff;
      if (target >= o) return -1;
      // The rest of the name lives at the target; check it, but the name ends here.
      let t = target;
      let guard = 0;
      while (t < buf.length && guard++ < 128) {
        const l = buf[t]!;
        if (l === 0) return o + 2;
        if ((l & 0xc0) === 0xc0) {
          if (t + 2 > buf.length) return -1;
          const nt = buf.readUInt16BE(t) & 0x3fff;
          if (nt >= t) return -1;
          t = nt;
          continue;
        }
        if (l & 0xc0) return -1;
        t += l + 1;
      }
      return -1;
    }
    if (len & 0xc0) return -1;
    total += len + 1;
    if (total > 255) return -1;
    o += len + 1;
  }
  return -1;
}

/** Does the message's framing hold together (counts, names, record lengths, nothing left over)? */
export function wellFormed(buf: Buffer): boolean {
  if (buf.length < HEADER) return false;
  let o = HEADER;
  const qd = buf.readUInt16BE(4);
  const rr = buf.readUInt16BE(6) + buf.readUInt16BE(8) + buf.readUInt16BE(10);
  for (let i = 0; i < qd; i++) {
    o = skipName(buf, o);
    if (o < 0 || o + 4 > buf.length) return false;
    o += 4;
  }
  for (let i = 0; i < rr; i++) {
    o = skipName(buf, o);
    if (o < 0 || o + 10 > buf.length) return false;
    o += 10 + buf.readUInt16BE(o + 8);
    if (o > buf.length) return false;
  }
  return o === buf.length;
}

/** Byte offset of the end of the first question, or -1 (also when its name is compressed: nothing precedes it). */
export function questionEnd(buf: Buffer): number {
  let o = HEADER;
  while (o < buf.length && buf[o] !== 0) {
    if (buf[o]! & 0xc0) return -1;
    o += buf[o]! + 1;
  }
  return o + 5 <= buf.length ? o + 5 : -1;
}

/** Does a reply answer this query: same id, QR set, and the same question (names compared case-insensitively)? */
export function isAnswerTo(query: Buffer, qEnd: number, reply: Buffer): boolean {
  if (reply.length < qEnd || reply.readUInt16BE(0) !== query.readUInt16BE(0) || !(reply[2]! & 0x80)) return false;
  return (
    reply.subarray(HEADER, qEnd).toString('latin1').toLowerCase() ===
    query.subarray(HEADER, qEnd).toString('latin1').toLowerCase()
  );
}

/** An error reply: the query's id, opcode, RD and CD, and its question when there is one that decoded. */
export function errorReply(query: Buffer, rcode: number, question?: Question): Buffer {
  const qflags = query.readUInt16BE(2);
  const flags = (qflags & (0x7800 | F.RD | F.CD)) | rcode;
  if (!question) {
    const b = Buffer.alloc(HEADER);
    b.writeUInt16BE(query.readUInt16BE(0), 0);
    b.writeUInt16BE(F.QR | flags, 2);
    return b;
  }
  return dnsPacket.encode({
    id: query.readUInt16BE(0),
    type: 'response',
    flags,
    questions: [question as dnsPacket.Question],
  });
}

/** The largest reply the client takes: 64 KiB over TCP, else its EDNS size (at least 512). */
export function clientLimit(proto: Proto, additionals: readonly dnsPacket.Answer[]): number {
  if (proto === 'tcp') return MAX_TCP;
  const opt = additionals.find((a) => a.type === 'OPT') as { udpPayloadSize?: number } | undefined;
  return Math.max(MIN_UDP, Math.min(MAX_TCP, opt?.udpPayloadSize ?? MIN_UDP));
}

/** Encodes, dropping records from the end (additional, authority, answer) until it fits; TC when any was dropped. */
export function encodeWithin(msg: dnsPacket.Packet, limit: number): Buffer {
  let buf = dnsPacket.encode(msg);
  if (buf.length <= limit) return buf;
  const opt = (msg.additionals ?? []).filter((a) => a.type === 'OPT');
  const m = {
    ...msg,
    flags: (msg.flags ?? 0) | F.TC,
    answers: [...(msg.answers ?? [])],
    authorities: [...(msg.authorities ?? [])],
    additionals: (msg.additionals ?? []).filter((a) => a.type !== 'OPT'),
  };
  for (;;) {
    buf = dnsPacket.encode({ ...m, additionals: [...m.additionals, ...opt] });
    if (buf.length <= limit) return buf;
    if (m.additionals.length) m.additionals.pop();
    else if (m.authorities.length) m.authorities.pop();
    else if (m.answers.length) m.answers.pop();
    else return buf; // a question and an OPT always fit in 512 bytes
  }
}

export function shuffle<T>(a: T[]): T[] {
  for (let i = a.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [a[i], a[j]] = [a[j]!, a[i]!];
  }
  return a;
}

export function frame(msg: Buffer): Buffer {
  const f = Buffer.alloc(2 + msg.length);
  f.writeUInt16BE(msg.length, 0);
  msg.copy(f, 2);
  return f;
}

// dns-packet's record codecs, which its type definitions do not list.
const codecs = dnsPacket as unknown as {
  a: { encode(ip: string): Buffer };
  aaaa: { encode(ip: string): Buffer };
  name: { encode(n: string): Buffer };
};

/** RDLENGTH + RDATA of an A or AAAA record. */
export function addressRdata(type: 'A' | 'AAAA', ip: string): Buffer {
  return type === 'A' ? codecs.a.encode(ip) : codecs.aaaa.encode(ip);
}

export interface LocalAnswer {
  /** The query; its id and question are echoed byte for byte. */
  query: Buffer;
  qEnd: number;
  flags: number;
  ttl: number;
  /** A CNAME from the question to this name comes first, and the addresses belong to it. */
  cname?: string;
  type: 'A' | 'AAAA';
  /** RDLENGTH + RDATA of each address record, in answer order. */
  rdata: readonly Buffer[];
  limit: number;
}

/**
 * Writes a local answer with names compressed (RFC 1035 4.1.4): each owner is a pointer to the question or to the
 * CNAME's target, as Istio's replies are compressed, so about twice as many addresses fit in 512 bytes as
 * dns-packet's uncompressed encoding would allow. Addresses that do not fit are left out and TC is set.
 */
export function encodeLocalAnswer(a: LocalAnswer): Buffer {
  const question = a.query.subarray(HEADER, a.qEnd);
  const target = a.cname === undefined ? undefined : codecs.name.encode(a.cname.replace(/\.$/, ''));
  const cnameLen = target ? 12 + target.length : 0;
  const fixed = HEADER + question.length + cnameLen;
  const rrLen = a.type === 'A' ? 16 : 28;
  const fit = Math.max(0, Math.min(a.rdata.length, Math.floor((a.limit - fixed) / rrLen)));
  const buf = Buffer.alloc(fixed + fit * rrLen);
  buf.writeUInt16BE(a.query.readUInt16BE(0), 0);
  buf.writeUInt16BE(F.QR | a.flags | (fit < a.rdata.length ? F.TC : 0), 2);
  buf.writeUInt16BE(1, 4);
  buf.writeUInt16BE((target ? 1 : 0) + fit, 6);
  let o = HEADER + question.copy(buf, HEADER);
  let owner = 0xc000 | HEADER;
  const rr = (type: number) => {
    buf.writeUInt16BE(owner, o);
    buf.writeUInt16BE(type, o + 2);
    buf.writeUInt16BE(1, o + 4); // IN
    buf.writeUInt32BE(a.ttl, o + 6);
    o += 10;
  };
  if (target) {
    rr(5);
    buf.writeUInt16BE(target.length, o);
    owner = 0xc000 | (o + 2);
    o += 2 + target.copy(buf, o + 2);
  }
  for (let i = 0; i < fit; i++) {
    rr(a.type === 'A' ? 1 : 28);
    o += a.rdata[i]!.copy(buf, o);
  }
  return buf;
}

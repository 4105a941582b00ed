// DNS answers compared with the Go agent's: one mesh config, one list of questions, and the normal form of dig's
// output that both agents must give. scripts/dns-golden.ts records the Go agent's answers into
// test/golden/dns-go-agent.json; test/dns-agent.test.ts asks this agent the same questions.

import type { DigResult } from './dns';

const SE = (name: string, hosts: string, extra: string) => `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ${name}, namespace: test}
spec:
  hosts: [${hosts}]
${extra}  ports: [{number: 8080, name: http, protocol: HTTP}]
  resolution: DNS
  endpoints: [{address: localhost}]
`;

/** The mesh both agents serve (the Go agent through `pilot-agent discovery`, this one with --standalone). */
export const PARITY_CONFIG: Record<string, string> = {
  'backend.yaml': SE('backend', 'backend.example.local', ''),
  'reviews.yaml': SE('reviews', 'reviews.test.svc.cluster.local', '  addresses: [10.20.0.7, fd00::7]\n'),
  'ratings.yaml': SE('ratings', 'ratings.other.svc.cluster.local', '  addresses: [10.20.0.8]\n'),
  'many.yaml': SE('many', 'many.example.com', `  addresses: [${Array.from({ length: 60 }, (_, i) => `10.40.0.${i + 1}`).join(', ')}]\n`),
};

/** The VM's resolv.conf (dnsmasq on 127.0.0.1:53 answers outside.test and is authoritative for .test). */
export const PARITY_RESOLV_CONF = 'nameserver 127.0.0.1\nsearch test.svc.cluster.local svc.cluster.local\n';
export const PARITY_DNSMASQ_ARGS = ['--address=/outside.test/10.9.9.9'];

export const PARITY_QUERIES: { name: string; type: string; opts: string[] }[] = [
  ...['backend.example.local', 'reviews', 'reviews.test', 'reviews.test.svc', 'reviews.test.svc.cluster.local', 'ratings.other',
    'ratings.other.svc', 'ratings', 'reviews.test.svc.cluster', 'backend.example.local.test.svc.cluster.local',
    'reviews.test.svc.cluster.local.test.svc.cluster.local', 'backend.example.local.svc.cluster.local', 'Backend.Example.LOCAL',
    'outside.test', 'nowhere.test'].map((name) => ({ name, type: 'A', opts: [] })),
  ...['backend.example.local', 'reviews', 'reviews.test.svc.cluster.local', 'backend.example.local.test.svc.cluster.local'].map((name) => ({ name, type: 'AAAA', opts: [] })),
  { name: 'backend.example.local', type: 'TXT', opts: [] },
  { name: 'outside.test', type: 'MX', opts: [] },
  { name: 'reviews', type: 'A', opts: ['+tcp'] },
  { name: 'many.example.com', type: 'A', opts: ['+bufsize=512', '+ignore'] },
  { name: 'many.example.com', type: 'A', opts: ['+noedns', '+ignore'] },
  { name: 'many.example.com', type: 'A', opts: ['+bufsize=1232', '+ignore'] },
  { name: 'many.example.com', type: 'A', opts: ['+bufsize=4096'] },
  { name: 'many.example.com', type: 'A', opts: ['+noedns'] },
  { name: 'many.example.com', type: 'A', opts: ['+tcp'] },
];

export interface Normal {
  status: string;
  flags: string[];
  /** Sorted `name type ttl data` lines (names lowercased: Istio answers in the table's case, this agent in the question's). */
  answers: string[] | { count: number };
  retriedTcp: boolean;
}

/** What must match: status, header flags, the answer set (a count when addresses are many and shuffled), TCP retry. */
export function normalize(r: DigResult): Normal {
  const lines = r.answers.map((a) => `${a.name.toLowerCase()} ${a.type} ${a.ttl} ${a.data.toLowerCase()}`).sort();
  return {
    status: r.status,
    flags: r.flags.filter((f) => ['qr', 'aa', 'tc', 'rd', 'ra'].includes(f)).sort(),
    answers: lines.length > 10 ? { count: lines.length } : lines,
    retriedTcp: r.retriedTcp,
  };
}

// ---- malformed packets: how each agent answers (or not) at the wire level ----

const q = (name: string, type = 1) => {
  const labels = name.split('.').map((l) => Buffer.concat([Buffer.from([l.length]), Buffer.from(l)]));
  return Buffer.concat([...labels, Buffer.from([0, type >> 8, type & 255, 0, 1])]);
};
const header = (id: number, flags: number, qd: number, an = 0, ns = 0, ar = 0) => {
  const b = Buffer.alloc(12);
  [id, flags, qd, an, ns, ar].forEach((v, i) => b.writeUInt16BE(v, i * 2));
  return b;
};

/** Hand-made packets (hex): each agent's reply is reduced to `rcode` and whether it answered at all. */
export const PARITY_PACKETS: { label: string; hex: string }[] = [
  { label: 'a valid query', hex: Buffer.concat([header(0x1111, 0x0100, 1), q('backend.example.local')]).toString('hex') },
  { label: 'no question', hex: header(0x1112, 0x0100, 0).toString('hex') },
  { label: 'two questions', hex: Buffer.concat([header(0x1113, 0x0100, 2), q('backend.example.local'), q('reviews')]).toString('hex') },
  { label: 'a response (QR set)', hex: Buffer.concat([header(0x1114, 0x8100, 1), q('backend.example.local')]).toString('hex') },
  { label: 'opcode NOTIFY', hex: Buffer.concat([header(0x1115, 0x2100, 1), q('backend.example.local')]).toString('hex') },
  { label: 'opcode UPDATE', hex: Buffer.concat([header(0x1116, 0x2900, 1), q('backend.example.local')]).toString('hex') },
  { label: 'question cut short', hex: Buffer.concat([header(0x1117, 0x0100, 1), q('backend.example.local').subarray(0, 9)]).toString('hex') },
  { label: 'shorter than a header', hex: header(0x1118, 0x0100, 1).subarray(0, 11).toString('hex') },
  { label: 'a name pointing at itself', hex: Buffer.concat([header(0x1119, 0x0100, 1), Buffer.from([0xc0, 0x0c, 0, 1, 0, 1])]).toString('hex') },
  { label: 'three additional records claimed', hex: Buffer.concat([header(0x111a, 0x0100, 1, 0, 0, 3), q('backend.example.local')]).toString('hex') },
  { label: 'huge counts', hex: Buffer.concat([header(0x111b, 0x0100, 1, 0xffff, 0xffff, 0xffff), q('backend.example.local')]).toString('hex') },
  { label: 'an unknown class (CHAOS TXT version.bind)', hex: Buffer.concat([header(0x111c, 0x0100, 1), Buffer.from('0776657273696f6e0462696e640000100003', 'hex')]).toString('hex') },
];

export interface RawNormal {
  answered: boolean;
  rcode?: number;
  idEcho?: boolean;
  qdcount?: number;
  ancount?: number;
}

/** Sends each packet over UDP from inside `run`'s namespace to 127.0.0.1:port; a second without a reply is "none". */
export const RAW_SCRIPT = `
const dgram = require('dgram');
const [port, ...hexes] = process.argv.slice(1);
(async () => {
  const out = [];
  for (const h of hexes) {
    out.push(await new Promise((resolve) => {
      const s = dgram.createSocket('udp4');
      const t = setTimeout(() => { s.close(); resolve(''); }, 1000);
      s.on('message', (m) => { clearTimeout(t); s.close(); resolve(m.toString('hex')); });
      s.send(Buffer.from(h, 'hex'), Number(port), '127.0.0.1');
    }));
  }
  process.stdout.write(JSON.stringify(out));
})();
`;

export function normalizeRaw(sentHex: string, replyHex: string): RawNormal {
  if (!replyHex) return { answered: false };
  const r = Buffer.from(replyHex, 'hex');
  if (r.length < 12) return { answered: true };
  return { answered: true, rcode: r.readUInt16BE(2) & 0xf, idEcho: r.readUInt16BE(0) === Buffer.from(sentHex, 'hex').readUInt16BE(0), qdcount: r.readUInt16BE(4), ancount: r.readUInt16BE(6) };
}

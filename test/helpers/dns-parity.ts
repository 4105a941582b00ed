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

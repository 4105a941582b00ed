// Benchmark: the DNS proxy. A UDP load generator keeps a fixed number of queries in flight and measures each one,
// for (1) names in the name table, answered by the proxy, (2) names forwarded by the proxy to dnsmasq, and (3) the
// same names asked of dnsmasq directly (the baseline). The proxy runs in its own process, as in the agent.
// Prints queries/s and p50/p99 latency per case, median over rounds, side by side.
// Run: npx tsx bench/dns.bench.ts [queries-per-round] [rounds] [in-flight]

import { fork } from 'node:child_process';
import { DnsServer } from '../lib/dns-server';
import type { NameTable } from '../lib/xds-istio';
import { startDnsmasq } from '../test/helpers/dns';
import { load, type Result } from './dns-load';

const QUERIES = Number(process.argv[2] ?? 20_000);
const ROUNDS = Number(process.argv[3] ?? 5);
const IN_FLIGHT = Number(process.argv[4] ?? 16);
const TABLE_HOSTS = 1000;

function table(): NameTable {
  const t: NameTable['table'] = {};
  for (let i = 0; i < TABLE_HOSTS; i++) {
    t[`svc${i}.bench.svc.cluster.local`] = { ips: [`10.${i >> 8}.${i & 255}.1`, `10.${i >> 8}.${i & 255}.2`], registry: 'Kubernetes', shortname: `svc${i}`, namespace: 'bench' };
  }
  return { table: t };
}

async function proxyChild(upstream: string): Promise<void> {
  const s = new DnsServer({ address: '127.0.0.1:0', upstreams: [upstream], searchDomains: ['bench.svc.cluster.local'], proxyNamespace: 'bench', proxyDomain: 'bench.svc.cluster.local' });
  await s.start();
  s.updateTable(table());
  process.send!({ port: s.port });
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function main(): Promise<void> {
  if (process.argv[2] === 'proxy-child') return proxyChild(process.argv[3]!);
  const upstream = await startDnsmasq(['--address=/fwd.test/10.9.9.9', '--cache-size=1000']);
  const child = fork(__filename, ['proxy-child', upstream.address], { execArgv: process.execArgv, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  try {
    const { port } = await new Promise<{ port: number }>((r) => child.once('message', (m) => r(m as { port: number })));
    const hit = Array.from({ length: TABLE_HOSTS }, (_, i) => `svc${i}.bench.svc.cluster.local`);
    const fwd = Array.from({ length: 1000 }, (_, i) => `n${i}.fwd.test`);
    const cases: [string, number, string[]][] = [
      ['table hit, through the proxy', port, hit],
      ['forwarded, through the proxy -> dnsmasq', port, fwd],
      ['dnsmasq directly (baseline)', upstream.port, fwd],
    ];
    const results = new Map<string, Result[]>();
    await load(port, hit, 2000, IN_FLIGHT); // warm-up
    await load(port, fwd, 2000, IN_FLIGHT);
    for (let r = 0; r < ROUNDS; r++) {
      for (const [name, p, names] of cases) {
        const res = await load(p, names, QUERIES, IN_FLIGHT);
        results.set(name, [...(results.get(name) ?? []), res]);
      }
    }
    console.log(`DNS proxy: ${QUERIES} A queries per round, ${ROUNDS} rounds, ${IN_FLIGHT} in flight, one UDP client; ${TABLE_HOSTS}-host table`);
    console.log('| case | queries/s | p50 | p99 | lost |');
    console.log('|---|---|---|---|---|');
    for (const [name] of cases) {
      const rs = results.get(name)!;
      console.log(`| ${name} | ${Math.round(median(rs.map((x) => x.qps))).toLocaleString('en-US')} | ${median(rs.map((x) => x.p50)).toFixed(3)} ms | ${median(rs.map((x) => x.p99)).toFixed(3)} ms | ${rs.reduce((a, x) => a + x.lost, 0)} |`);
    }
  } finally {
    child.kill();
    await upstream.stop();
  }
}

void main();

// The DNS benchmarks' load generator: one UDP socket keeps `inFlight` A queries outstanding and times each one.
// As a program (run inside a network namespace by bench/dns-vs-go.bench.ts):
//   tsx bench/dns-load.ts <port> <total> <inFlight> <name,name,...>   -> one JSON Result on stdout

import * as dgram from 'node:dgram';
import * as dnsPacket from 'dns-packet';

export interface Result {
  qps: number;
  p50: number;
  p99: number;
  lost: number;
}

/** Sends `total` A queries for names from `names`, `inFlight` at a time, one socket; returns rate and latencies. */
export function load(port: number, names: string[], total: number, inFlight: number): Promise<Result> {
  const sock = dgram.createSocket('udp4');
  const started = new Map<number, number>();
  const lat: number[] = [];
  let sent = 0;
  let lost = 0;
  let nextId = 0;
  const packets = names.map((name) => dnsPacket.encode({ id: 0, type: 'query', flags: dnsPacket.RECURSION_DESIRED, questions: [{ name, type: 'A' }] }));
  return new Promise((resolve) => {
    const t0 = performance.now();
    const send = () => {
      if (sent >= total) return;
      const id = nextId = (nextId + 1) & 0xffff;
      const p = Buffer.from(packets[sent % packets.length]!);
      p.writeUInt16BE(id, 0);
      started.set(id, performance.now());
      sent++;
      sock.send(p, port, '127.0.0.1');
    };
    const finish = () => {
      clearInterval(sweep);
      sock.close();
      const secs = (performance.now() - t0) / 1000;
      lat.sort((a, b) => a - b);
      resolve({ qps: lat.length / secs, p50: lat[Math.floor(lat.length * 0.5)]!, p99: lat[Math.floor(lat.length * 0.99)]!, lost });
    };
    sock.on('message', (msg) => {
      const id = msg.readUInt16BE(0);
      const t = started.get(id);
      if (t === undefined) return;
      started.delete(id);
      lat.push(performance.now() - t);
      if (lat.length + lost >= total) return finish();
      send();
    });
    // A query unanswered for a second counts as lost and is replaced.
    const sweep = setInterval(() => {
      const now = performance.now();
      for (const [id, t] of started) {
        if (now - t < 1000) continue;
        started.delete(id);
        lost++;
        if (lat.length + lost >= total) return finish();
        send();
      }
    }, 250);
    sock.bind(0, '127.0.0.1', () => {
      for (let i = 0; i < inFlight; i++) send();
    });
  });
}

if (require.main === module) {
  const [port, total, inFlight, names] = process.argv.slice(2);
  load(Number(port), names!.split(','), Number(total), Number(inFlight)).then((r) => process.stdout.write(JSON.stringify(r) + '\n'));
}

// Benchmark of workload identity.
// 1. Key + CSR generation (ECDSA P-256 and RSA 2048), and key + CSR + signing by the test CA (in process, no
//    network), per certificate.
// 2. SDS push: from push(name) to a real Envoy's ACK of the new secret, per secret (`default` with its key).
// Run: npx tsx bench/identity.bench.ts [rounds]

import * as path from 'node:path';
import { generateKeyAndCsr, spiffeId } from '../lib/csr';
import { configureLogging } from '../lib/log';
import { SdsServer, type SecretValue } from '../lib/sds-server';
import { freePort, tempDir, waitFor } from '../test/helpers/harness';
import { startSdsEnvoy } from '../test/helpers/sds-envoy';
import { makeIntermediate, makeLeaf, makeRoot, signCsr } from '../test/helpers/test-ca';

const ROUNDS = Number(process.argv[2] ?? 20);
configureLogging({ outputLevel: 'sds:warn,cache:warn' });

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
const fmt = (xs: number[]) => `median ${median(xs).toFixed(1)} ms, max ${Math.max(...xs).toFixed(1)} ms (n=${xs.length})`;

async function main(): Promise<void> {
  const id = spiffeId('cluster.local', 'bench', 'app');
  const root = await makeRoot();
  const inter = await makeIntermediate(root);
  for (const algorithm of [{ kind: 'ECDSA' as const }, { kind: 'RSA' as const, bits: 2048 }]) {
    const gen: number[] = [];
    const total: number[] = [];
    for (let i = 0; i < ROUNDS; i++) {
      const t0 = performance.now();
      const { csrPem } = await generateKeyAndCsr({ identity: id, algorithm });
      const t1 = performance.now();
      await signCsr(inter, csrPem, { ttlMs: 3600_000 });
      gen.push(t1 - t0);
      total.push(performance.now() - t0);
    }
    console.log(`${algorithm.kind.padEnd(5)} key + CSR: ${fmt(gen)}; key + CSR + sign: ${fmt(total)}`);
  }

  const dir = tempDir();
  const values = new Map<string, SecretValue>();
  const sock = path.join(dir.path, 'socket');
  const sds = new SdsServer({ socketPath: sock, provider: { secret: (n) => values.get(n) } });
  await sds.start();
  const leaves = await Promise.all(Array.from({ length: ROUNDS + 1 }, () => makeLeaf(root, { uri: id })));
  values.set('ROOTCA', { kind: 'root', rootPem: root.pem });
  values.set('default', { kind: 'tls', certChainPem: leaves[0]!.certPem, keyPem: leaves[0]!.keyPem });
  const envoy = await startSdsEnvoy({ sdsSocket: sock, inbound: { port: await freePort(), backendPort: await freePort() } });
  try {
    const acked = () => sds.streamStatus().find((s) => s.names.includes('default'))?.acked.default;
    await waitFor('the first ACK', () => acked(), 15_000, 5);
    const push: number[] = [];
    for (let i = 1; i <= ROUNDS; i++) {
      const before = acked();
      values.set('default', { kind: 'tls', certChainPem: leaves[i]!.certPem, keyPem: leaves[i]!.keyPem });
      const t0 = performance.now();
      sds.push('default');
      await waitFor('the ACK', () => acked() !== before, 10_000, 1);
      push.push(performance.now() - t0);
    }
    console.log(`SDS push of default to a real Envoy until its ACK: ${fmt(push)}`);
  } finally {
    await envoy.stop();
    await sds.close();
    dir.cleanup();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

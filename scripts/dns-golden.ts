// Records the Go pilot-agent's DNS answers for test/helpers/dns-parity.ts into test/golden/dns-go-agent.json.
// The Go agent runs as a sidecar with DNS capture in a network namespace, fed by this project's
// `pilot-agent discovery` (so both agents get the same name table), with dnsmasq as the namespace's resolver.
// Run as root, after `bash scripts/build.sh`:
//   npx tsx scripts/dns-golden.ts /root/go/bin/pilot-agent /path/to/istio/tools/packaging/common/envoy_bootstrap.json \
//     'where the Go agent and the template came from'

import { type ChildProcess, execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { agentBin } from '../test/helpers/agent';
import { dig, startDnsmasq } from '../test/helpers/dns';
import {
  normalize, normalizeRaw, PARITY_CONFIG, PARITY_DNSMASQ_ARGS, PARITY_PACKETS, PARITY_QUERIES, PARITY_RESOLV_CONF, RAW_SCRIPT,
} from '../test/helpers/dns-parity';
import { envoyBin, REPO, tempDir, waitFor } from '../test/helpers/harness';
import { createNetns } from '../test/helpers/netns';

async function main(): Promise<void> {
  const [goAgent, template, source = ''] = process.argv.slice(2);
  if (!goAgent || !template) throw new Error('usage: dns-golden.ts <go pilot-agent> <envoy_bootstrap.json template>');
  const tmp = tempDir('pa-dns-golden-');
  const ns = createNetns('padnsg', { 'resolv.conf': PARITY_RESOLV_CONF }, '10.99.0.2/24');
  const procs: ChildProcess[] = [];
  const dnsmasq = await startDnsmasq(PARITY_DNSMASQ_ARGS, { netns: ns, port: 53 }).catch((e: Error) => {
    ns.remove();
    tmp.cleanup();
    throw e;
  });
  let goLog = '';
  try {
    const config = path.join(tmp.path, 'config');
    fs.mkdirSync(config);
    for (const [f, text] of Object.entries(PARITY_CONFIG)) fs.writeFileSync(path.join(config, f), text);
    procs.push(ns.spawn(agentBin(), ['discovery', '--config-dir', config, '--grpc-addr', '127.0.0.1:15010'], { stdio: 'ignore' }));
    const run = path.join(tmp.path, 'go');
    fs.mkdirSync(path.join(run, 'var/lib/istio/envoy'), { recursive: true });
    fs.copyFileSync(template, path.join(run, 'var/lib/istio/envoy/envoy_bootstrap_tmpl.json'));
    const go = ns.spawn(goAgent, ['proxy', 'sidecar'], {
      cwd: run,
      stdio: ['ignore', 'pipe', 'pipe'],
      env: {
        PATH: process.env.PATH ?? '/usr/bin:/bin',
        PROXY_CONFIG: JSON.stringify({
          discoveryAddress: '127.0.0.1:15010', controlPlaneAuthPolicy: 'NONE', binaryPath: envoyBin(), configPath: path.join(run, 'proxy'),
          drainDuration: '1s', terminationDrainDuration: '1s',
        }),
        POD_NAME: 'vm-1', POD_NAMESPACE: 'test', INSTANCE_IP: '10.99.0.2', ISTIO_META_DNS_CAPTURE: 'true',
      },
    });
    go.stdout!.on('data', (d) => (goLog += d));
    go.stderr!.on('data', (d) => (goLog += d));
    procs.push(go);
    await waitFor('the Go agent answering from its name table', async () => (await dig(15053, 'backend.example.local', 'A', [], '127.0.0.1', ns)).answers.length > 0, 60_000, 500)
      .catch((e: Error) => { throw new Error(`${e.message}\n${goLog}`); });
    const queries = [];
    for (const q of PARITY_QUERIES) queries.push({ ...q, expect: normalize(await dig(15053, q.name, q.type, q.opts, '127.0.0.1', ns)) });
    const raw = JSON.parse((await ns.run(process.execPath, ['-e', RAW_SCRIPT, '15053', ...PARITY_PACKETS.map((p) => p.hex)])).stdout) as string[];
    const packets = PARITY_PACKETS.map((p, i) => ({ ...p, expect: normalizeRaw(p.hex, raw[i]!) }));
    const version = execFileSync(goAgent, ['version'], { encoding: 'utf8' }).trim().split('\n').pop();
    const golden = {
      generatedBy: `npx tsx scripts/dns-golden.ts ${goAgent} ${template}`,
      goAgent: version,
      source,
      date: new Date().toISOString().slice(0, 10),
      queries,
      packets,
    };
    fs.writeFileSync(path.join(REPO, 'test/golden/dns-go-agent.json'), JSON.stringify(golden, null, 2) + '\n');
    process.stdout.write(`wrote test/golden/dns-go-agent.json (${queries.length} questions, ${packets.length} packets)\n`);
  } finally {
    for (const p of procs.reverse()) {
      if (p.exitCode !== null || p.signalCode !== null) continue;
      // SIGTERM first: the Go agent then stops its Envoy too.
      const exited = new Promise((r) => p.once('exit', r));
      p.kill('SIGTERM');
      const t = setTimeout(() => p.kill('SIGKILL'), 15_000);
      await exited;
      clearTimeout(t);
    }
    await dnsmasq.stop();
    ns.remove();
    tmp.cleanup();
  }
}

main().catch((e: Error) => {
  process.stderr.write(`${e.stack ?? e.message}\n`);
  process.exit(1);
});

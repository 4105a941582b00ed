// End to end in one process: the embedded discovery server's NameTable goes through the xDS proxy (subscribed after
// a real Envoy's first LDS request) into the DNS proxy, and dig resolves the mesh's names with it; names that are
// not in the mesh go to the upstream resolver (dnsmasq). A config change reaches dig without a restart.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { buildNameTable } from '../lib/discovery/gen-nametable';
import { DiscoveryServer } from '../lib/discovery/index';
import { DnsServer } from '../lib/dns-server';
import { configureLogging, resetLogging } from '../lib/log';
import { XdsProxy } from '../lib/xds-proxy';
import { decodeNameTable, NAME_TABLE_TYPE } from '../lib/xds-istio';
import { dig, startDnsmasq } from './helpers/dns';
import { startEnvoy } from './helpers/discovery-envoy';
import { tempDir, waitFor } from './helpers/harness';

const SE = (name: string, host: string, extra = '') => `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ${name}, namespace: test}
spec:
  hosts: [${host}]
${extra}  ports: [{number: 8080, name: http, protocol: HTTP}]
  resolution: DNS
  endpoints: [{address: localhost}]
`;

for (const delta of [false, true]) {
  test(`${delta ? 'delta' : 'sotw'}: dig resolves ServiceEntry hosts from the discovery server's NDS through the xDS proxy; the rest is forwarded`, async () => {
    const dir = tempDir('pa-dns-nds-');
    const stops: (() => Promise<void>)[] = [];
    configureLogging({ write: () => {} });
    try {
      const upstream = await startDnsmasq(['--address=/outside.test/10.9.9.9']);
      stops.push(() => upstream.stop());
      fs.mkdirSync(path.join(dir.path, 'config'));
      fs.writeFileSync(path.join(dir.path, 'config', 'backend.yaml'), SE('backend', 'backend.example.local'));
      fs.writeFileSync(path.join(dir.path, 'config', 'reviews.yaml'), SE('reviews', 'reviews.test.svc.cluster.local', '  addresses: [10.20.0.7]\n'));
      const discovery = new DiscoveryServer({ configDir: path.join(dir.path, 'config'), listen: `unix:${path.join(dir.path, 'discovery.sock')}`, debounceMs: 10 });
      await discovery.start();
      stops.push(() => discovery.close());
      const dns = new DnsServer({
        address: '127.0.0.1:0', upstreams: [upstream.address], searchDomains: ['test.svc.cluster.local'],
        proxyNamespace: 'test', proxyDomain: 'test.svc.cluster.local',
      });
      await dns.start();
      stops.push(() => dns.close());
      const xds = new XdsProxy({ socketPath: path.join(dir.path, 'XDS'), upstream: { address: `unix://${path.join(dir.path, 'discovery.sock')}`, tls: false } });
      // What agent.ts wires: the NameTable handler feeds the DNS proxy; a rejected table is a NACK.
      xds.registerHandler(NAME_TABLE_TYPE, (res) => {
        if (!dns.updateTable(res.length ? decodeNameTable(res[0]!) : { table: {} })) throw new Error('name table rejected');
      });
      await xds.start();
      stops.push(() => xds.close());
      assert.is((await dig(dns.port, 'backend.example.local')).status, 'SERVFAIL', 'no table before Envoy asks for config');
      const envoy = await startEnvoy({ xdsAddress: path.join(dir.path, 'XDS'), nodeId: 'sidecar~10.0.0.1~app-1.test~test.svc.cluster.local', delta });
      stops.push(() => envoy.stop());
      await waitFor('the first name table', () => dns.readiness().ready, 20_000);

      const vip = buildNameTable(discovery.pushContext).table['backend.example.local']!.ips[0]!;
      assert.match(vip, /^240\.240\./);
      const r = await dig(dns.port, 'backend.example.local');
      assert.is(r.status, 'NOERROR');
      assert.ok(r.flags.includes('aa'));
      assert.equal(r.answers.map((a) => a.data), [vip]);
      assert.equal((await dig(dns.port, 'reviews', 'A', ['+tcp'])).answers.map((a) => a.data), ['10.20.0.7']);
      assert.equal((await dig(dns.port, 'reviews.test')).answers.map((a) => a.data), ['10.20.0.7']);
      const chain = await dig(dns.port, 'backend.example.local.test.svc.cluster.local');
      assert.equal(chain.answers.map((a) => a.type), ['CNAME', 'A']);
      assert.equal((await dig(dns.port, 'outside.test')).answers.map((a) => a.data), ['10.9.9.9']);
      assert.is((await dig(dns.port, 'nowhere.test')).status, 'NXDOMAIN');

      fs.writeFileSync(path.join(dir.path, 'config', 'late.yaml'), SE('late', 'late.example.local'));
      discovery.reload();
      const late = await waitFor('the new host in DNS', async () => {
        const a = await dig(dns.port, 'late.example.local');
        return a.answers.length ? a : undefined;
      }, 20_000, 200);
      assert.match(late.answers[0]!.data, /^240\.240\./);
      assert.equal((await dig(dns.port, 'backend.example.local')).answers.map((a) => a.data), [vip], 'VIP unchanged');
    } finally {
      for (const s of stops.reverse()) await s();
      resetLogging();
      dir.cleanup();
    }
  });
}

test.run();

// NDS from the embedded discovery server: ServiceEntry hosts with their addresses or an auto-allocated VIP from
// 240.240.0.0/16 (stable across restarts, collisions resolved), pushed to a proxy that subscribes to the NameTable
// type, SotW and Delta, and pushed again when the config changes.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { allocateVips, slotAddress } from '../lib/discovery/auto-vip';
import { buildNameTable } from '../lib/discovery/gen-nametable';
import { DiscoveryServer } from '../lib/discovery/index';
import { configureLogging, resetLogging } from '../lib/log';
import { istioRoot, NAME_TABLE_TYPE, type NameTable } from '../lib/xds-istio';
import { AdsClient, type Response } from './helpers/discovery-client';
import { tempDir } from './helpers/harness';

const NODE = { id: 'sidecar~10.0.0.1~app-1.test~test.svc.cluster.local' };

const CONFIG = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: test}
spec:
  hosts: [api.example.com]
  addresses: [10.50.0.1, 10.50.0.2]
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints: [{address: 127.0.0.1}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: backend, namespace: test}
spec:
  hosts: [backend.example.local]
  ports: [{number: 8080, name: http, protocol: HTTP}]
  resolution: DNS
  endpoints: [{address: localhost}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: bookinfo}
spec:
  hosts: [reviews.bookinfo.svc.cluster.local, ratings]
  ports: [{number: 9080, name: http, protocol: HTTP}]
  workloadSelector: {labels: {app: reviews}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: reviews-vm, namespace: bookinfo}
spec: {address: 10.60.0.5, labels: {app: reviews}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: range, namespace: test}
spec:
  hosts: [range.example.com]
  addresses: [10.70.0.0/24]
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints: [{address: 10.70.0.9}]
`;

function decode(r: Response, delta: boolean): NameTable {
  const any = (delta ? (r.resources[0] as { resource: { value: Uint8Array } }).resource : r.resources[0]) as unknown as { type_url: string; value: Uint8Array };
  assert.is(any.type_url, NAME_TABLE_TYPE);
  const t = istioRoot().lookupType('istio.networking.nds.v1.NameTable');
  return t.toObject(t.decode(any.value), { defaults: true, arrays: true, objects: true }) as NameTable;
}

async function withServer(fn: (s: DiscoveryServer, dir: string) => Promise<void>): Promise<void> {
  const dir = tempDir('pa-disc-nds-');
  configureLogging({ write: () => {} });
  fs.writeFileSync(path.join(dir.path, 'a.yaml'), CONFIG);
  const s = new DiscoveryServer({ configDir: dir.path, listen: '127.0.0.1:0', debounceMs: 10 });
  try {
    await s.start();
    await fn(s, dir.path);
  } finally {
    await s.close();
    resetLogging();
    dir.cleanup();
  }
}

test('VIPs: deterministic, inside 240.240.0.0/16 (never .0 or .255), one per host even when thousands collide', () => {
  const svc = (hostname: string, addresses: string[] = []) => ({ hostname, addresses, resolution: 'STATIC' as const });
  const hosts = Array.from({ length: 5000 }, (_, i) => svc(`svc-${i}.example.com`));
  const a = allocateVips(hosts);
  const b = allocateVips([...hosts].reverse());
  assert.equal([...a].sort(), [...b].sort(), 'the order services come in does not matter');
  const ips = [...a.values()];
  assert.is(ips.length, 5000);
  assert.is(new Set(ips).size, 5000, 'no two hosts share a VIP');
  for (const ip of ips) assert.match(ip, /^240\.240\.(\d+)\.(\d+)$/);
  assert.ok(ips.every((ip) => !/\.(0|255)$/.test(ip)));
  // Adding hosts moves almost none of the existing ones.
  const more = allocateVips([...hosts, ...Array.from({ length: 100 }, (_, i) => svc(`new-${i}.example.org`))]);
  const moved = [...a].filter(([h, ip]) => more.get(h) !== ip).length;
  assert.ok(moved <= 10, `${moved} moved`);
  // Hosts with addresses get none, and a declared 240.240 address is never handed out again.
  const first = allocateVips([svc('x.example.com')]).get('x.example.com')!;
  const c = allocateVips([svc('x.example.com'), svc('y.example.com', [first]), svc('*.wild.example.com')]);
  assert.is.not(c.get('x.example.com'), first);
  assert.not.ok(c.has('y.example.com'));
  assert.not.ok(c.has('*.wild.example.com'));
  assert.is(slotAddress(0), '240.240.0.1');
  assert.is(slotAddress(253), '240.240.0.254');
  assert.is(slotAddress(254), '240.240.1.1');
});

test('the name table holds every ServiceEntry host: its IP addresses, else a VIP; CIDR-only hosts are left out', () =>
  withServer(async (s) => {
    const nt = buildNameTable(s.pushContext);
    assert.equal(Object.keys(nt.table).sort(), ['api.example.com', 'backend.example.local', 'ratings', 'reviews.bookinfo.svc.cluster.local']);
    assert.is(nt.table.ratings!.registry, 'External', 'a short host is a name of its own, as in Istio');
    assert.equal(nt.table['api.example.com'], { ips: ['10.50.0.1', '10.50.0.2'], registry: 'External', shortname: '', namespace: '' });
    assert.match(nt.table['backend.example.local']!.ips[0]!, /^240\.240\./);
    // A host named like a Kubernetes service of its own namespace answers to the short forms too; the
    // WorkloadEntry it selects does not change its entry.
    const reviews = nt.table['reviews.bookinfo.svc.cluster.local']!;
    assert.equal({ ...reviews, ips: [] }, { ips: [], registry: 'Kubernetes', shortname: 'reviews', namespace: 'bookinfo' });
    assert.match(reviews.ips[0]!, /^240\.240\./);
  }));

test('a proxy that subscribes to the NameTable gets it (SotW and Delta), again after a change, with the same VIPs after a restart', async () => {
  let vip = '';
  await withServer(async (s, dir) => {
    for (const delta of [false, true]) {
      const c = AdsClient.connect(s.address, delta);
      try {
        c.send({ node: NODE, type_url: NAME_TABLE_TYPE });
        const r1 = await c.next(NAME_TABLE_TYPE);
        const nt = decode(r1, delta);
        vip = nt.table['backend.example.local']!.ips[0]!;
        assert.ok(vip.startsWith('240.240.'));
        c.send(delta ? { type_url: NAME_TABLE_TYPE, response_nonce: r1.nonce } : { type_url: NAME_TABLE_TYPE, version_info: r1.version_info, response_nonce: r1.nonce });
        fs.writeFileSync(path.join(dir, `more-${delta}.yaml`), `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: more-${delta}, namespace: test}
spec:
  hosts: [more-${delta}.example.com]
  addresses: [10.80.0.${delta ? 2 : 1}]
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints: [{address: 10.80.0.9}]
`);
        s.reload();
        const r2 = await c.next(NAME_TABLE_TYPE);
        const nt2 = decode(r2, delta);
        assert.equal(nt2.table[`more-${delta}.example.com`]?.ips, [`10.80.0.${delta ? 2 : 1}`]);
        assert.is(nt2.table['backend.example.local']!.ips[0], vip, 'unrelated hosts keep their VIP');
      } finally {
        c.close();
      }
    }
  });
  await withServer(async (s) => {
    assert.is(buildNameTable(s.pushContext).table['backend.example.local']!.ips[0], vip, 'same VIP after a restart');
  });
});

test('the name table holds only the hosts the proxy sees: exportTo and its Sidecar\'s egress hosts, as its clusters', async () => {
  const dir = tempDir('pa-disc-nds-scope-');
  const se = (name: string, ns: string, ip: string, exportTo = '') => `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ${name}, namespace: ${ns}}
spec:
  hosts: [${name}.example.com]
  addresses: [${ip}]
  ports: [{number: 80, name: http, protocol: HTTP}]
  endpoints: [{address: ${ip}}]
${exportTo}---
`;
  fs.writeFileSync(path.join(dir.path, 'c.yaml'), `${se('a', 'test', '10.1.0.1')}${se('b', 'other', '10.1.0.2')}${se('hidden', 'other', '10.1.0.3', '  exportTo: ["."]\n')}apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: narrow}
spec:
  egress:
  - hosts: ["other/*"]
`);
  const s = new DiscoveryServer({ configDir: dir.path, listen: `unix:${path.join(dir.path, 'xds.sock')}` });
  try {
    await s.start();
    const { generate } = await import('../lib/discovery/generate');
    const { proxyFromNode } = await import('../lib/discovery/proxy');
    const hosts = (ns: string) => {
      const r = generate(s.pushContext, proxyFromNode({ id: `sidecar~10.0.0.1~app.${ns}~${ns}.svc.cluster.local` }), NAME_TABLE_TYPE).get('nametable')!;
      return Object.keys((istioRoot().lookupType('istio.networking.nds.v1.NameTable').decode(r.any.value) as unknown as NameTable).table).sort();
    };
    assert.equal(hosts('test'), ['a.example.com', 'b.example.com'], 'exportTo "." keeps hidden in its namespace');
    assert.equal(hosts('other'), ['a.example.com', 'b.example.com', 'hidden.example.com']);
    assert.equal(hosts('narrow'), ['b.example.com'], 'the Sidecar admits only other/*');
  } finally {
    await s.close();
    dir.cleanup();
  }
});

test('a ServiceEntry address that is neither an IP nor a CIDR is a config error naming the field', async () => {
  const dir = tempDir('pa-disc-nds-bad-');
  configureLogging({ write: () => {} });
  fs.writeFileSync(path.join(dir.path, 'a.yaml'), CONFIG.replace('10.50.0.2', 'not-an-ip'));
  const s = new DiscoveryServer({ configDir: dir.path, listen: '127.0.0.1:0' });
  try {
    const err = await s.start().then(() => undefined, (e: Error) => e);
    assert.match(String(err?.message), /spec\.addresses\[1\]: "not-an-ip" is not an IP address or CIDR/);
  } finally {
    await s.close();
    resetLogging();
    dir.cleanup();
  }
});

test.run();

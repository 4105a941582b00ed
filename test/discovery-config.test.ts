import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { MemoryConfigStore } from '../lib/discovery/config-store';
import { FileConfigSource } from '../lib/discovery/file-source';
import type { Config, Event, ServiceEntrySpec, VirtualServiceSpec } from '../lib/discovery/model';
import { formatIssue, parseConfigFile } from '../lib/discovery/yaml-file';
import { configureLogging, resetLogging } from '../lib/log';
import { generate } from '../lib/discovery/generate';
import { proxyFromNode } from '../lib/discovery/proxy';
import { PushContext } from '../lib/discovery/push-context';
import { ServiceEntryRegistry } from '../lib/discovery/registry';
import { TYPE_URLS } from '../lib/discovery/resources';
import { unpackAny } from '../lib/envoy-protos';
import { envoyBin, REPO, tempDir } from './helpers/harness';

const SE = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: web
  namespace: demo
spec:
  hosts: [web.example.local]
  ports:
  - {number: 8080, name: http, protocol: HTTP}
  endpoints:
  - address: 127.0.0.1
    ports: {http: 9001}
    labels: {version: v1}
`;

const VS = (weightV1: number) => `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: web
  namespace: demo
spec:
  hosts: [web.example.local]
  http:
  - route:
    - destination: {host: web.example.local}
      weight: ${weightV1}
    - destination: {host: web.example.local}
      weight: ${100 - weightV1}
`;

function messages(file: string, text: string): string[] {
  return parseConfigFile(file, text).issues.map(formatIssue);
}

test('a valid multi-document file yields normalised configs with their source', () => {
  const r = parseConfigFile('/c/a.yaml', `${SE}---\n${VS(80)}---\n`);
  assert.equal(r.issues, []);
  assert.is(r.configs.length, 2);
  const se = r.configs[0] as Config<ServiceEntrySpec>;
  assert.is(se.meta.kind, 'ServiceEntry');
  assert.is(se.spec.resolution, 'STATIC');
  assert.equal(se.spec.endpoints[0]!.ports, { http: 9001 });
  assert.is(se.meta.source!.doc, 1);
  const vs = r.configs[1] as Config<VirtualServiceSpec>;
  assert.is(vs.meta.source!.doc, 2);
  assert.equal(vs.spec.http[0]!.route.map((d) => d.weight), [80, 20]);
});

test('an unknown field is rejected with file, document, field path and line', () => {
  const text = `${SE}---\n${VS(80).replace('  - route:', '  - delegate: {name: other}\n    route:')}`;
  const [msg, ...rest] = messages('/c/a.yaml', text);
  assert.is(rest.length, 0);
  assert.match(msg!, /^\/c\/a\.yaml:23:\d+: document 2 \(VirtualService demo\/web\): field spec\.http\[0\]\.delegate: unknown or unsupported field "delegate"/);
});

test('unknown kinds, bad YAML, weights that do not add up and bad values are each named', () => {
  assert.match(messages('/c/k.yaml', SE.replace('kind: ServiceEntry', 'kind: EnvoyFilter'))[0]!, /field kind: unknown or unsupported kind "EnvoyFilter"/);
  assert.match(messages('/c/y.yaml', 'kind: [unclosed\n')[0]!, /^\/c\/y\.yaml:\d+:\d+: document 1: invalid YAML/);
  assert.match(messages('/c/w.yaml', VS(70).replace('weight: 30', 'weight: 20'))[0]!, /field spec\.http\[0\]\.route: destination weights add up to 90, not 100/);
  assert.match(messages('/c/p.yaml', SE.replace('number: 8080', 'number: 80800'))[0]!, /field spec\.ports\[0\]\.number: 80800 is above the maximum 65535/);
  assert.match(messages('/c/r.yaml', SE.replace('resolution', 'x').replace('address: 127.0.0.1', 'address: web.internal'))[0]!, /field spec\.endpoints\[0\]\.address: "web\.internal" is not an IP address/);
  assert.match(messages('/c/t.yaml', SE.replace('protocol: HTTP', 'protocol: HTTPS'))[0]!, /"HTTPS" is not supported by the standalone discovery server/);
});

test('ConfigStore: create, update, delete bump versions and call handlers in order', () => {
  const store = new MemoryConfigStore();
  const seen: string[] = [];
  store.registerEventHandler('ServiceEntry', (old, cur, e: Event) => seen.push(`${e}:${old?.meta.resourceVersion ?? '-'}->${cur?.meta.resourceVersion ?? '-'}`));
  const [c] = parseConfigFile('/c/a.yaml', SE).configs;
  const v0 = store.version();
  const r1 = store.create(c!);
  assert.is.not(store.version(), v0);
  assert.throws(() => store.create(c!), /already exists/);
  const got = store.get('ServiceEntry', 'web', 'demo')!;
  assert.is(got.meta.resourceVersion, r1);
  assert.ok(Object.isFrozen(got));
  const r2 = store.update({ ...got, spec: { ...(got.spec as ServiceEntrySpec), hosts: ['web2.example.local'] } });
  assert.throws(() => store.update(got), /stale/);
  assert.is(store.list('ServiceEntry', 'demo').length, 1);
  assert.is(store.list('ServiceEntry', 'other').length, 0);
  store.delete('ServiceEntry', 'web', 'demo');
  assert.is(store.get('ServiceEntry', 'web', 'demo'), undefined);
  assert.equal(seen, [`add:-->${r1}`, `update:${r1}->${r2}`, `delete:${r2}->-`]);
});

async function withLogs<T>(fn: (lines: string[]) => Promise<T>): Promise<T> {
  const lines: string[] = [];
  configureLogging({ write: (l) => lines.push(l) });
  try {
    return await fn(lines);
  } finally {
    resetLogging();
  }
}

test('file source: a bad edit keeps the last good version of that file, and logs file and field once', async () => {
  const dir = tempDir();
  try {
    await withLogs(async (lines) => {
      const store = new MemoryConfigStore();
      const events: string[] = [];
      store.registerEventHandler('VirtualService', (_o, _c, e) => events.push(e));
      const src = new FileConfigSource({ dir: dir.path, store });
      fs.writeFileSync(path.join(dir.path, 'se.yaml'), SE);
      fs.writeFileSync(path.join(dir.path, 'vs.yaml'), VS(80));
      assert.equal((await src.sync()).issues, []);
      assert.equal(events, ['add']);
      fs.writeFileSync(path.join(dir.path, 'vs.yaml'), VS(80).replace('weight: 20', 'weight: "twenty"'));
      const r = await src.sync();
      assert.is(r.changed, false);
      assert.is(r.issues.length, 1);
      const vs = store.get('VirtualService', 'web', 'demo') as Config<VirtualServiceSpec>;
      assert.equal(vs.spec.http[0]!.route.map((d) => d.weight), [80, 20]);
      await src.sync(); // the same problem again is not logged again
      const errs = lines.filter((l) => l.includes('\terror\t'));
      assert.is(errs.length, 1);
      assert.match(errs[0]!, /vs\.yaml:\d+:\d+: document 1 \(VirtualService demo\/web\): field spec\.http\[0\]\.route\[1\]\.weight: must be an integer/);
      fs.writeFileSync(path.join(dir.path, 'vs.yaml'), VS(50));
      assert.is((await src.sync()).changed, true);
      assert.equal(events, ['add', 'update']);
      assert.ok(lines.some((l) => l.includes('config errors resolved')));
    });
  } finally {
    dir.cleanup();
  }
});

test('file source: a set with a broken reference or a duplicate is not applied at all', async () => {
  const dir = tempDir();
  try {
    await withLogs(async () => {
      const store = new MemoryConfigStore();
      const src = new FileConfigSource({ dir: dir.path, store });
      fs.writeFileSync(path.join(dir.path, 'se.yaml'), SE);
      fs.writeFileSync(path.join(dir.path, 'vs.yaml'), VS(80));
      await src.sync();
      // Valid on its own, but routes to a host nobody defines; a new file in the same round must not apply either.
      fs.writeFileSync(path.join(dir.path, 'vs.yaml'), VS(80).replace('- destination: {host: web.example.local}\n      weight: 20', '- destination: {host: nowhere.local}\n      weight: 20'));
      fs.writeFileSync(path.join(dir.path, 'se2.yaml'), SE.replace(/web/g, 'api'));
      const r = await src.sync();
      assert.is(r.changed, false);
      assert.match(formatIssue(r.issues[0]!), /vs\.yaml:\d+:\d+: document 1 \(VirtualService demo\/web\): field spec\.http\[0\]\.route\[1\]\.destination\.host: route to unknown host "nowhere\.local"/);
      assert.is(store.get('ServiceEntry', 'api', 'demo'), undefined);
      fs.writeFileSync(path.join(dir.path, 'vs.yaml'), VS(80));
      fs.writeFileSync(path.join(dir.path, 'dup.yaml'), SE.replace('web.example.local', 'other.example.local'));
      const d = await src.sync();
      assert.match(formatIssue(d.issues[0]!), /duplicate name: ServiceEntry demo\/web is also defined in .*dup\.yaml|duplicate name: ServiceEntry demo\/web is also defined in .*se\.yaml/);
      fs.rmSync(path.join(dir.path, 'dup.yaml'));
      const ok = await src.sync();
      assert.equal(ok.issues, []);
      assert.ok(store.get('ServiceEntry', 'api', 'demo'));
    });
  } finally {
    dir.cleanup();
  }
});

test('file source: removing a file deletes its configs', async () => {
  const dir = tempDir();
  try {
    const store = new MemoryConfigStore();
    const src = new FileConfigSource({ dir: dir.path, store });
    fs.writeFileSync(path.join(dir.path, 'se.yaml'), SE);
    fs.writeFileSync(path.join(dir.path, 'notes.txt'), 'not config');
    await src.sync();
    assert.is(store.list('ServiceEntry').length, 1);
    fs.rmSync(path.join(dir.path, 'se.yaml'));
    assert.is((await src.sync()).changed, true);
    assert.is(store.list('ServiceEntry').length, 0);
  } finally {
    dir.cleanup();
  }
});

test('the shipped standalone example loads cleanly and routes as its README says', async () => {
  const store = new MemoryConfigStore();
  const reg = new ServiceEntryRegistry(store);
  reg.run();
  const src = new FileConfigSource({ dir: path.join(REPO, 'examples/standalone/config'), store });
  assert.equal((await src.sync({ report: false })).issues.map(formatIssue), []);
  const push = PushContext.build('x', store, reg);
  const sidecar = proxyFromNode({ id: 'sidecar~127.0.0.1~app.demo~demo.svc.cluster.local' });
  assert.equal([...generate(push, sidecar, TYPE_URLS.listener).keys()], ['127.0.0.1_8080']);
  const rc = unpackAny(generate(push, sidecar, TYPE_URLS.route).get('8080')!.any) as {
    virtual_hosts: { domains: string[]; routes: { name: string; route: { cluster?: string; weighted_clusters?: { clusters: { name: string; weight: { value: number } }[] } } }[] }[];
  };
  const vh = rc.virtual_hosts[0]!;
  // istiod's domains (the port ignored, the absolute name too), and the listener address the README curls.
  assert.equal(vh.domains, ['backend.example.local', 'backend.example.local.', '127.0.0.1']);
  assert.equal(rc.virtual_hosts.map((v) => v.domains), [vh.domains, ['*']], 'unknown Hosts fall to allow_any');
  assert.equal(vh.routes.map((r) => r.name), ['pinned-by-header', 'v1-path', 'weighted']);
  assert.equal(vh.routes[2]!.route.weighted_clusters!.clusters.map((c) => [c.name, c.weight.value]), [
    ['outbound|8080|v1|backend.example.local', 80],
    ['outbound|8080|v2|backend.example.local', 20],
  ]);
  const router = proxyFromNode({ id: 'router~127.0.0.1~gw.demo~demo.svc.cluster.local' });
  assert.equal([...generate(push, router, TYPE_URLS.listener).keys()], ['127.0.0.1_8088']);
  // The example's plain-Envoy bootstrap is one Envoy accepts.
  execFileSync(envoyBin(), ['--mode', 'validate', '-c', path.join(REPO, 'examples/standalone/envoy-sidecar.yaml'), '--disable-hot-restart', '-l', 'error'], { stdio: 'pipe' });
});

test.run();

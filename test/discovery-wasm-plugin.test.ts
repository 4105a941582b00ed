// WasmPlugin in the embedded discovery server, as istiod serves it: the HTTP connection managers of the proxies a
// plugin selects get an extension_config_discovery filter per plugin (phase and priority order, match by mode and
// port), and ECDS serves the TypedExtensionConfig with the module as a remote data source and the agent's
// ISTIO_META_WASM_* settings (the pull secret itself only to an authenticated proxy). Bad specs are refused with
// the file, line and field. A real Envoy ACKs the listener and ECDS and runs a real proxy-wasm module (file://),
// on its own (SotW and Delta) and behind the whole standalone agent (dist/pilot-agent proxy --standalone).

import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as http from 'node:http';
import * as net from 'node:net';
import type { AddressInfo } from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { DiscoveryServer } from '../lib/discovery/index';
import { generate } from '../lib/discovery/generate';
import { proxyFromNode, withIdentity } from '../lib/discovery/proxy';
import { TYPE_URLS } from '../lib/discovery/resources';
import { formatIssue, parseConfigFile } from '../lib/discovery/yaml-file';
import { unpackAny } from '../lib/envoy-protos';
import { adsBootstrap } from './helpers/ads-bootstrap';
import { spawnTestEnvoy } from './helpers/discovery-envoy';
import { agentFixture } from './helpers/agent-fixture';
import { freePort, httpRequest, tempDir, waitFor } from './helpers/harness';

const ECDS_HTTP_TYPES = [
  'type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm',
  'type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC',
];
const name = (ns: string, n: string) => `extensions.istio.io/wasmplugin/${ns}.${n}`;
const DOCKER_CONFIG = JSON.stringify({ auths: { 'registry.test:5000': { auth: Buffer.from('u:p').toString('base64') } } });

const CONFIG = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: web, namespace: test }
spec:
  hosts: [web.test.local]
  location: MESH_INTERNAL
  ports: [{ number: 8080, name: http, protocol: HTTP }, { number: 9000, name: tcp, protocol: TCP }]
  endpoints: [{ address: 10.0.0.7, labels: { app: web } }]
---
apiVersion: v1
kind: Secret
metadata: { name: pull, namespace: test }
type: kubernetes.io/dockerconfigjson
stringData:
  .dockerconfigjson: '${DOCKER_CONFIG}'
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: authz, namespace: test }
spec:
  selector: { matchLabels: { app: web } }
  phase: AUTHZ
  priority: 10
  url: oci://registry.test:5000/plugins/authz:v1
  sha256: ${'ab'.repeat(32)}
  imagePullPolicy: Always
  imagePullSecret: pull
  pluginName: authz_root
  pluginConfig: { deny: ["/admin"], level: 2 }
  failStrategy: FAIL_OPEN
  vmConfig:
    env:
    - { name: MODE, value: strict }
    - { name: HOSTNAME, valueFrom: HOST }
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: authn, namespace: istio-system }
spec:
  phase: AUTHN
  url: https://plugins.test/authn.wasm
  match: [{ mode: CLIENT, ports: [{ number: 8080 }] }]
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: stats-low, namespace: test }
spec: { phase: STATS, priority: 1, url: registry.test/stats:low }
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: stats-high, namespace: test }
spec: { phase: STATS, priority: 100, url: "file:///opt/plugins/stats.wasm" }
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: late, namespace: test }
spec: { url: oci://registry.test/late, match: [{ mode: SERVER }] }
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: tcp-filter, namespace: test }
spec: { type: NETWORK, url: oci://registry.test/tcp, match: [{ ports: [{ number: 9000 }] }] }
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: elsewhere, namespace: other }
spec: { url: oci://registry.test/elsewhere }
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: not-me, namespace: test }
spec: { selector: { matchLabels: { app: db } }, url: oci://registry.test/not-me }
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: for-gw, namespace: test }
spec:
  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: edge }]
  url: oci://registry.test/gw
`;

async function buildPush(dir: string) {
  const { MemoryConfigStore } = await import('../lib/discovery/config-store');
  const { ServiceEntryRegistry } = await import('../lib/discovery/registry');
  const { FileConfigSource } = await import('../lib/discovery/file-source');
  const { PushContext } = await import('../lib/discovery/push-context');
  const store = new MemoryConfigStore();
  const reg = new ServiceEntryRegistry(store);
  reg.run();
  const { issues } = await new FileConfigSource({ dir, store }).sync({ report: false });
  assert.equal(issues.map(formatIssue), []);
  return PushContext.build('v1', store, reg);
}

const labelsMeta = (labels: Record<string, string>) => ({
  fields: { LABELS: { structValue: { fields: Object.fromEntries(Object.entries(labels).map(([k, v]) => [k, { stringValue: v }])) } } },
});
type Obj = Record<string, any>;
const decode = (r: { any: Parameters<typeof unpackAny>[0] }) => unpackAny(r.any) as Obj;
const hcmOf = (l: Obj, chain = 0) => unpackAny(l.filter_chains[chain].filters.at(-1).typed_config) as Obj;

test('the listeners of selected proxies carry one ECDS filter per plugin, in phase and priority order', async () => {
  const dir = tempDir('pa-wasm-gen-');
  try {
    fs.writeFileSync(path.join(dir.path, 'c.yaml'), CONFIG);
    const push = await buildPush(dir.path);
    const web = proxyFromNode({ id: 'sidecar~10.0.0.7~web-0.test~test.svc.cluster.local', metadata: labelsMeta({ app: 'web' }) });
    const listeners = new Map([...generate(push, web, TYPE_URLS.listener).values()].map((r) => [r.name, decode(r)]));
    const out = hcmOf(listeners.get('127.0.0.1_8080')!);
    const names = out.http_filters.map((f: Obj) => f.name);
    assert.equal(names, [
      name('istio-system', 'authn'), name('test', 'authz'), name('test', 'stats-high'), name('test', 'stats-low'),
      'envoy.filters.http.grpc_stats', 'envoy.filters.http.fault', 'envoy.filters.http.cors', 'envoy.filters.http.router',
    ]);
    const authz = out.http_filters[1];
    assert.equal(authz.config_discovery.type_urls, ECDS_HTTP_TYPES);
    assert.ok(authz.config_discovery.config_source.ads, 'over ADS');
    assert.equal(authz.config_discovery.config_source.initial_fetch_timeout, { seconds: 0, nanos: 0 }, 'Envoy waits for it');
    // The NETWORK plugin sits before tcp_proxy on the TCP port it matches, and on no HTTP listener.
    const tcp = listeners.get('127.0.0.1_9000')!.filter_chains[0].filters.map((f: Obj) => f.name);
    assert.equal(tcp, [name('test', 'tcp-filter'), 'envoy.filters.network.tcp_proxy']);
    // Inbound (SERVER): not the CLIENT-only authn, but `late`, which matches SERVER only.
    const inbound = hcmOf(listeners.get('inbound_10.0.0.7_8080')!);
    assert.equal(inbound.http_filters.map((f: Obj) => f.name),
      [name('test', 'authz'), name('test', 'stats-high'), name('test', 'stats-low'), name('test', 'late'), 'envoy.filters.http.router']);

    // Another namespace gets the root namespace's plugin only; a proxy without the labels misses the selecting one.
    const other = proxyFromNode({ id: 'sidecar~10.0.0.9~x.other~other.svc.cluster.local' });
    const otherNames = hcmOf(decode(generate(push, other, TYPE_URLS.listener).get('127.0.0.1_8080')!)).http_filters.map((f: Obj) => f.name);
    assert.equal(otherNames.slice(0, 2), [name('istio-system', 'authn'), name('other', 'elsewhere')]);
    const plain = proxyFromNode({ id: 'sidecar~10.0.0.8~db-0.test~test.svc.cluster.local', metadata: labelsMeta({ app: 'db' }) });
    const plainNames = hcmOf(decode(generate(push, plain, TYPE_URLS.listener).get('127.0.0.1_8080')!)).http_filters.map((f: Obj) => f.name);
    assert.ok(plainNames.includes(name('test', 'not-me')) && !plainNames.includes(name('test', 'authz')));
    assert.ok(!plainNames.includes(name('test', 'for-gw')), 'targetRefs never apply to a sidecar');
  } finally {
    dir.cleanup();
  }
});

test('ECDS: the Wasm filter with remote code, sha256, config, env, failure policy; the pull secret only when authenticated', async () => {
  const dir = tempDir('pa-wasm-ecds-');
  try {
    fs.writeFileSync(path.join(dir.path, 'c.yaml'), CONFIG);
    const push = await buildPush(dir.path);
    const anon = proxyFromNode({ id: 'sidecar~10.0.0.7~web-0.test~test.svc.cluster.local', metadata: labelsMeta({ app: 'web' }) });
    const ecds = (p: typeof anon) => new Map([...generate(push, p, TYPE_URLS.extensionConfig).values()].map((r) => [r.name, decode(r)]));
    const got = ecds(anon);
    assert.equal([...got.keys()].sort(), [
      name('istio-system', 'authn'), name('test', 'authz'), name('test', 'late'), name('test', 'stats-high'),
      name('test', 'stats-low'), name('test', 'tcp-filter'),
    ]);
    const tec = got.get(name('test', 'authz'))!;
    assert.is(tec.name, name('test', 'authz'));
    assert.is(tec.typed_config.type_url, ECDS_HTTP_TYPES[0]);
    const pc = unpackAny(tec.typed_config).config as Obj;
    assert.is(pc.name, 'test.authz');
    assert.is(pc.root_id, 'authz_root');
    assert.is(pc.failure_policy, 'FAIL_OPEN');
    assert.equal(JSON.parse((unpackAny(pc.configuration) as Obj).value), { deny: ['/admin'], level: 2 });
    assert.is(pc.vm_config.runtime, 'envoy.wasm.runtime.v8');
    assert.equal(pc.vm_config.code.remote.http_uri, { uri: 'oci://registry.test:5000/plugins/authz:v1', timeout: { seconds: 30, nanos: 0 }, cluster: '_' });
    assert.is(pc.vm_config.code.remote.sha256, 'ab'.repeat(32));
    const env = pc.vm_config.environment_variables;
    assert.equal(env.host_env_keys, ['HOSTNAME']);
    assert.is(env.key_values.MODE, 'strict');
    assert.is(env.key_values.ISTIO_META_WASM_IMAGE_PULL_POLICY, 'Always');
    assert.ok(env.key_values.ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION, 'the resource version is set');
    assert.is(env.key_values.ISTIO_META_WASM_IMAGE_PULL_SECRET, '', 'no secret for an anonymous proxy');
    const verified = withIdentity(anon, { namespace: 'test', serviceAccount: 'web', via: 'token' } as never);
    const secret = (unpackAny(ecds(verified).get(name('test', 'authz'))!.typed_config).config as Obj)
      .vm_config.environment_variables.key_values.ISTIO_META_WASM_IMAGE_PULL_SECRET;
    assert.is(secret, DOCKER_CONFIG, 'the docker config itself, for the agent to pull with');

    // Defaults: no scheme means oci://, file:// is a local file, an empty config is an empty Any, FAIL_CLOSE.
    const low = unpackAny(got.get(name('test', 'stats-low'))!.typed_config).config as Obj;
    assert.is(low.vm_config.code.remote.http_uri.uri, 'oci://registry.test/stats:low');
    assert.is(low.failure_policy, 'FAIL_CLOSED');
    assert.is(low.configuration?.type_url ?? '', '');
    assert.equal(Object.keys(low.vm_config.environment_variables.key_values), ['ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION']);
    const high = unpackAny(got.get(name('test', 'stats-high'))!.typed_config).config as Obj;
    assert.equal(high.vm_config.code, { local: { filename: '/opt/plugins/stats.wasm' } });
    assert.is(got.get(name('test', 'tcp-filter'))!.typed_config.type_url, 'type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm');

    // A Gateway API gateway of the namespace gets its targetRefs plugin, and, as istiod by default, the plugins
    // that select by labels (none here: the selector-less ones); another gateway name does not get it.
    const gwMeta = (n: string) => labelsMeta({ 'gateway.networking.k8s.io/gateway-name': n });
    const gw = proxyFromNode({ id: 'router~10.0.0.3~edge-0.test~test.svc.cluster.local', metadata: gwMeta('edge') });
    const gwNames = [...generate(push, gw, TYPE_URLS.extensionConfig).keys()];
    assert.ok(gwNames.includes(name('test', 'for-gw')) && gwNames.includes(name('test', 'stats-low')), gwNames.join());
    assert.ok(!gwNames.includes(name('test', 'authz')), 'its selector does not pick the gateway');
    const other = proxyFromNode({ id: 'router~10.0.0.4~edge-0.test~test.svc.cluster.local', metadata: gwMeta('inner') });
    assert.ok(![...generate(push, other, TYPE_URLS.extensionConfig).keys()].includes(name('test', 'for-gw')));
  } finally {
    dir.cleanup();
  }
});

const issuesOf = (spec: string) => parseConfigFile('/cfg/wasm.yaml', `apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: bad, namespace: test }
spec:
${spec}`).issues.map(formatIssue);

test('bad WasmPlugins are refused naming the file, line and field', () => {
  const cases: [string, RegExp][] = [
    ['  url: ftp://x/y.wasm', /wasm\.yaml:5:\d+: .*field spec\.url: scheme ftp is not one of oci, http, https, file/],
    ['  pluginName: x', /field spec\.url: is required/],
    ['  url: oci://r/p\n  sha256: ABC', /field spec\.sha256: "ABC" is not 64 lowercase hex digits/],
    ['  url: oci://r/p\n  phase: EARLY', /field spec\.phase: "EARLY" is not one of/],
    ['  url: oci://r/p\n  failStrategy: FAIL_SOMETIMES', /field spec\.failStrategy/],
    ['  url: oci://r/p\n  selector: { matchLabels: { a: b } }\n  targetRefs: [{ group: gateway.networking.k8s.io, kind: Gateway, name: g }]',
      /field spec\.selector: selector and targetRef\(s\) are exclusive/],
    ['  url: oci://r/p\n  targetRefs: [{ kind: Service, name: s }]', /field spec\.targetRefs\[0\]: only gateway\.networking\.k8s\.io Gateways/],
    ['  url: oci://r/p\n  vmConfig: { env: [{ name: A }, { name: A }] }', /field spec\.vmConfig\.env\[1\]\.name: "A" is listed twice/],
    ['  url: oci://r/p\n  vmConfig: { env: [{ name: A, value: x, valueFrom: HOST }] }', /field spec\.vmConfig\.env\[0\]\.value: may only be set when valueFrom is INLINE/],
    ['  url: oci://r/p\n  vmConfig: { env: [{ name: ISTIO_META_WASM_IMAGE_PULL_SECRET, value: x }] }', /env\[0\]\.name: ISTIO_META_ variables are the agent's/],
    ['  url: oci://r/p\n  match: [{ ports: [{ number: 70000 }] }]', /field spec\.match\[0\]\.ports\[0\]\.number: 70000 is above the maximum 65535/],
    ['  url: oci://r/p\n  match: [{ mode: BOTH }]', /field spec\.match\[0\]\.mode/],
    ['  url: oci://r/p\n  priority: 1.5', /field spec\.priority: must be an integer/],
    ['  url: oci://r/p\n  type: UDP', /field spec\.type/],
    ['  url: oci://r/p\n  imagePullSecret: "Not_A_Name"', /field spec\.imagePullSecret/],
    ['  url: oci://r/p\n  sidecarScope: all', /unknown or unsupported field "sidecarScope"/],
  ];
  for (const [spec, want] of cases) {
    const got = issuesOf(spec);
    assert.ok(got.some((m) => want.test(m)), `${spec}\n  want ${want}\n  got ${JSON.stringify(got)}`);
  }
  assert.equal(issuesOf('  url: oci://r/p'), [], 'a url alone is a valid plugin');
  const wrongApi = parseConfigFile('/cfg/w.yaml', 'apiVersion: networking.istio.io/v1\nkind: WasmPlugin\nmetadata: { name: x }\nspec: { url: oci://r/p }\n');
  assert.match(wrongApi.issues.map(formatIssue).join('\n'), /apiVersion: "networking\.istio\.io\/v1" is not one of extensions\.istio\.io\/v1alpha1/);
  const secret = parseConfigFile('/cfg/s.yaml', 'apiVersion: v1\nkind: Secret\nmetadata: { name: s }\ntype: kubernetes.io/dockerconfigjson\nstringData: { .dockerconfigjson: "{}" }\n');
  assert.match(secret.issues.map(formatIssue).join('\n'), /stringData\.\.dockerconfigjson: has no "auths" mapping/);
});

/** A proxy-wasm (ABI 0.2.1) module that adds `x-wasm-plugin: ran` to every response, assembled with wabt. */
function headerModule(): Buffer {
  try {
    execFileSync('wat2wasm', ['--version'], { stdio: 'ignore' });
  } catch {
    execFileSync('apt-get', ['install', '-y', '-qq', '--no-install-recommends', 'wabt'], { stdio: 'inherit', env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' } });
  }
  const wat = `(module
  (import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 16) "x-wasm-plugin")
  (data (i32.const 64) "ran")
  (global $heap (mut i32) (i32.const 4096))
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param $size i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.and (i32.add (i32.add (global.get $heap) (local.get $size)) (i32.const 7)) (i32.const -8)))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow (i32.add (i32.div_u (global.get $heap) (i32.const 65536)) (i32.const 1))))))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
    (drop (call $add (i32.const 2) (i32.const 16) (i32.const 13) (i32.const 64) (i32.const 3)))
    (i32.const 0))
  (func (export "proxy_on_done") (param i32) (result i32) (i32.const 1))
  (func (export "proxy_on_log") (param i32))
  (func (export "proxy_on_delete") (param i32))
)`;
  return assemble(wat);
}

/** A proxy-wasm module with the network callbacks, passing every byte on: a NETWORK plugin for a TCP port. */
function networkModule(): Buffer {
  return assemble(`(module
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 4096))
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param $size i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (i32.add (local.get $size) (i32.const 8))))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_new_connection") (param i32) (result i32) (i32.const 0))
  (func (export "proxy_on_downstream_data") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_upstream_data") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_downstream_connection_close") (param i32 i32))
  (func (export "proxy_on_upstream_connection_close") (param i32 i32))
  (func (export "proxy_on_done") (param i32) (result i32) (i32.const 1))
  (func (export "proxy_on_log") (param i32))
  (func (export "proxy_on_delete") (param i32))
)`);
}

function assemble(wat: string): Buffer {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pa-wat-'));
  try {
    fs.writeFileSync(path.join(dir, 'm.wat'), wat);
    execFileSync('wat2wasm', [path.join(dir, 'm.wat'), '-o', path.join(dir, 'm.wasm')], { stdio: 'pipe' });
    return fs.readFileSync(path.join(dir, 'm.wasm'));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

for (const delta of [false, true]) test(`a real Envoy (${delta ? 'Delta' : 'SotW'}) ACKs the listener and its ECDS filter, runs the plugin, takes a plugin change over ECDS alone`, async () => {
  const dir = tempDir('pa-wasm-envoy-');
  const backend = http.createServer((req, res) => {
    req.resume();
    res.end('backend');
  });
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', r));
  let server: DiscoveryServer | undefined;
  let envoy: Awaited<ReturnType<typeof spawnTestEnvoy>> | undefined;
  try {
    const module = path.join(dir.path, 'plugin.wasm');
    fs.writeFileSync(module, headerModule());
    const [servicePort, adminPort] = [await freePort(), await freePort()];
    const plugin = (level: number) => `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: web, namespace: test }
spec:
  hosts: [web.test.local]
  ports: [{ number: ${servicePort}, name: http, protocol: HTTP }]
  endpoints: [{ address: 127.0.0.1, ports: { http: ${(backend.address() as AddressInfo).port} } }]
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: header, namespace: test }
spec:
  url: file://${module}
  pluginConfig: { level: ${level} }
  failStrategy: FAIL_CLOSE
`;
    const cfg = path.join(dir.path, 'config');
    fs.mkdirSync(cfg);
    fs.writeFileSync(path.join(cfg, 'c.yaml'), plugin(1));
    server = new DiscoveryServer({ configDir: cfg, listen: `unix:${path.join(dir.path, 'xds.sock')}`, debounceMs: 20 });
    await server.start();
    const bootstrap = adsBootstrap({ nodeId: 'sidecar~127.0.0.1~web-0.test~test.svc.cluster.local', adminPort, delta, xdsAddress: server.address });
    envoy = await spawnTestEnvoy(bootstrap, adminPort, 'pa-wasm-envoy-');
    const get = () => httpRequest(`http://127.0.0.1:${servicePort}/`, { headers: { host: 'web.test.local' }, timeoutMs: 5000 });
    const ok = () => get().then((r) => (r.status === 200 ? r : undefined), () => undefined);
    const first = await waitFor('a response through the listener with the plugin', ok, 30_000, 200);
    assert.is(first.body, 'backend');
    assert.is(first.headers['x-wasm-plugin'], 'ran', 'the module ran in Envoy');
    const dump = async () => JSON.parse((await httpRequest(`http://127.0.0.1:${adminPort}/config_dump`)).body) as Obj;
    const ecdsVersion = (d: Obj) => d.configs.find((c: Obj) => c['@type'].includes('EcdsConfigDump'))?.ecds_filters?.[0]?.version_info;
    const listenerVersion = (d: Obj) => d.configs.find((c: Obj) => c['@type'].includes('ListenersConfigDump'))
      .dynamic_listeners.find((l: Obj) => l.name === `127.0.0.1_${servicePort}`).active_state.version_info;
    const before = await dump();
    assert.ok(ecdsVersion(before), 'Envoy holds the ECDS filter');
    // A new pluginConfig changes the ECDS resource only: the listener (and its connections) stay as they are.
    fs.writeFileSync(path.join(cfg, 'c.yaml'), plugin(2));
    const after = await waitFor('the new ECDS version in Envoy', async () => {
      const d = await dump();
      return ecdsVersion(d) !== ecdsVersion(before) && d;
    }, 20_000, 200);
    assert.is(listenerVersion(after), listenerVersion(before), 'the listener was not resent');
    assert.is((await get()).headers['x-wasm-plugin'], 'ran');
    assert.equal(server.status().nacks, [], 'no NACK');
  } finally {
    await envoy?.stop();
    await server?.close();
    await new Promise((r) => backend.close(r));
    dir.cleanup();
  }
});

test('a real Envoy ACKs a NETWORK plugin\'s ECDS filter before tcp_proxy and TCP traffic passes through it', async () => {
  const dir = tempDir('pa-wasm-net-');
  const echo = net.createServer((c) => c.pipe(c));
  await new Promise<void>((r) => echo.listen(0, '127.0.0.1', r));
  let server: DiscoveryServer | undefined;
  let envoy: Awaited<ReturnType<typeof spawnTestEnvoy>> | undefined;
  try {
    fs.writeFileSync(path.join(dir.path, 'tcp.wasm'), networkModule());
    const [port, adminPort] = [await freePort(), await freePort()];
    const cfg = path.join(dir.path, 'config');
    fs.mkdirSync(cfg);
    fs.writeFileSync(path.join(cfg, 'c.yaml'), `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: echo, namespace: test }
spec:
  hosts: [echo.test.local]
  ports: [{ number: ${port}, name: tcp, protocol: TCP }]
  endpoints: [{ address: 127.0.0.1, ports: { tcp: ${(echo.address() as AddressInfo).port} } }]
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: tcp, namespace: test }
spec: { type: NETWORK, url: "file://${path.join(dir.path, 'tcp.wasm')}" }
`);
    server = new DiscoveryServer({ configDir: cfg, listen: `unix:${path.join(dir.path, 'xds.sock')}` });
    await server.start();
    const bootstrap = adsBootstrap({ nodeId: 'sidecar~127.0.0.1~a.test~test.svc.cluster.local', adminPort, delta: false, xdsAddress: server.address });
    envoy = await spawnTestEnvoy(bootstrap, adminPort, 'pa-wasm-net-envoy-');
    const roundTrip = () => new Promise<string>((resolve) => {
      let got = '';
      const c = net.connect(port, '127.0.0.1', () => c.write('ping'));
      c.on('data', (d) => {
        got += d.toString();
        if (got === 'ping') c.end();
      });
      c.on('error', () => resolve(''));
      c.on('close', () => resolve(got));
      c.setTimeout(2000, () => c.destroy());
    });
    await waitFor('an echo through the listener with the network plugin', async () => (await roundTrip()) === 'ping', 20_000, 200);
    const dump = JSON.parse((await httpRequest(`http://127.0.0.1:${adminPort}/config_dump`)).body) as Obj;
    const ecds = dump.configs.find((c: Obj) => c['@type'].includes('EcdsConfigDump'));
    assert.is(ecds.ecds_filters[0].ecds_filter.name, name('test', 'tcp'));
    assert.match(ecds.ecds_filters[0].ecds_filter.typed_config['@type'], /filters\.network\.wasm\.v3\.Wasm$/);
    assert.equal(server.status().nacks, [], 'no NACK');
  } finally {
    await envoy?.stop();
    await server?.close();
    await new Promise((r) => echo.close(r));
    dir.cleanup();
  }
});

test('standalone agent: a WasmPlugin in the config directory runs in its Envoy (file:// module, through the xDS proxy)', async () => {
  const dir = tempDir('pa-wasm-agent-');
  const backend = http.createServer((req, res) => {
    req.resume();
    res.end('backend');
  });
  await new Promise<void>((r) => backend.listen(0, '127.0.0.1', r));
  const module = path.join(dir.path, 'plugin.wasm');
  fs.writeFileSync(module, headerModule());
  const servicePort = await freePort();
  const cfgDir = path.join(dir.path, 'mesh');
  fs.mkdirSync(cfgDir);
  fs.writeFileSync(path.join(cfgDir, 'mesh.yaml'), `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: { name: web, namespace: test }
spec:
  hosts: [web.test.local]
  ports: [{ number: ${servicePort}, name: http, protocol: HTTP }]
  endpoints: [{ address: 127.0.0.1, ports: { http: ${(backend.address() as AddressInfo).port} } }]
---
apiVersion: extensions.istio.io/v1alpha1
kind: WasmPlugin
metadata: { name: header, namespace: istio-system }
spec: { url: "file://${module}", phase: STATS }
`);
  const agent = await agentFixture({ dir });
  try {
    await agent.start({ args: ['proxy', 'sidecar', '--standalone', cfgDir], env: { POD_NAME: 'web-client' } });
    const res = await waitFor('a response through the plugin', async () => {
      const r = await httpRequest(`http://127.0.0.1:${servicePort}/`, { headers: { host: 'web.test.local' } });
      return r.status === 200 && r.headers['x-wasm-plugin'] === 'ran' && r;
    }, 20_000, 200).catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
    assert.is(res.body, 'backend');
  } finally {
    await agent.close();
    await new Promise((r) => backend.close(r));
  }
});

test.run();

// WasmPlugin, the agent's side, with the real Envoy: istiod-style ECDS with a remote Wasm module goes through the
// xDS proxy, the agent fetches the module (a real proxy-wasm filter built with wat2wasm that adds a response
// header) from a loopback HTTP server, and Envoy runs it from the local file. Failures (wrong sha256, server down,
// over the size cap, blocked address) give the allow-all or deny-all stand-in per failStrategy, which Envoy ACKs.

import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as http from 'node:http';
import type { AddressInfo } from 'node:net';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { packAny } from '../lib/envoy-protos';
import { configureLogging, resetLogging } from '../lib/log';
import { newRegistry } from '../lib/metrics';
import { RBAC_HTTP_TYPE, WASM_HTTP_TYPE } from '../lib/wasm-config';
import { WasmEcds } from '../lib/wasm-ecds';
import type { WasmCacheOptions } from '../lib/wasm-cache';
import { blockList } from '../lib/wasm-fetch';
import { XdsProxy } from '../lib/xds-proxy';
import { adsBootstrap } from './helpers/ads-bootstrap';
import { agentFixture } from './helpers/agent-fixture';
import { CLUSTER, ControlPlane, LISTENER, NODE_ID, type Resource } from './helpers/control-plane';
import { envoyBin, freePort, httpRequest, tempDir, waitFor, type TempDir } from './helpers/harness';
import { ECDS, headerModule, wasmPluginResource } from './helpers/wasm-module';

type Kind = 'sotw' | 'delta';
const PLUGIN = 'ns.plugin';
const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const MODULE_A = headerModule('x-wasm', 'one');
const MODULE_B = headerModule('x-wasm', 'two');

/** A listener whose HTTP filter chain is the ECDS filter PLUGIN (Wasm or RBAC, as istiod lists them), then a 200. */
function ecdsListener(port: number, plugins: string[] = [PLUGIN]): Resource {
  const hcm = packAny('envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager', {
    stat_prefix: 'in',
    route_config: {
      virtual_hosts: [
        {
          name: 'all',
          domains: ['*'],
          routes: [{ match: { prefix: '/' }, direct_response: { status: 200, body: { inline_string: 'ok' } } }],
        },
      ],
    },
    http_filters: [
      ...plugins.map((name) => ({
        name,
        config_discovery: {
          config_source: { ads: {}, resource_api_version: 'V3' },
          type_urls: [WASM_HTTP_TYPE, RBAC_HTTP_TYPE],
        },
      })),
      {
        name: 'envoy.filters.http.router',
        typed_config: packAny('envoy.extensions.filters.http.router.v3.Router', {}),
      },
    ],
  });
  return {
    name: 'in',
    any: packAny('envoy.config.listener.v3.Listener', {
      name: 'in',
      address: { socket_address: { address: '127.0.0.1', port_value: port } },
      filter_chains: [{ filters: [{ name: 'envoy.filters.network.http_connection_manager', typed_config: hcm }] }],
    }),
  };
}

/** Serves modules by path, counts requests per path; `/hold/...` answers only when release() is called. */
class ModuleServer {
  readonly hits = new Map<string, number>();
  readonly files = new Map<string, Buffer>();
  private held: Array<() => void> = [];
  private readonly server = http.createServer((req, res) => {
    const p = req.url ?? '/';
    this.hits.set(p, (this.hits.get(p) ?? 0) + 1);
    if (p.startsWith('/redirect/')) {
      res.writeHead(302, { location: decodeURIComponent(p.slice('/redirect/'.length)) });
      return res.end();
    }
    const send = () => {
      const f = this.files.get(p.replace(/^\/hold/, ''));
      if (!f) {
        res.writeHead(404);
        return res.end();
      }
      res.end(f);
    };
    if (p.startsWith('/hold/')) this.held.push(send);
    else send();
  });
  port = 0;

  async start(): Promise<void> {
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', () => r()));
    this.port = (this.server.address() as AddressInfo).port;
  }

  url(p: string): string {
    return `http://127.0.0.1:${this.port}${p}`;
  }

  hit(p: string): number {
    return this.hits.get(p) ?? 0;
  }

  release(): void {
    for (const f of this.held.splice(0)) f();
  }

  async close(): Promise<void> {
    this.release();
    this.server.closeAllConnections();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}

interface Envoy {
  admin: number;
  proc: ChildProcess;
  output(): string;
  stop(): Promise<void>;
}

async function startEnvoy(dir: string, kind: Kind, socket: string): Promise<Envoy> {
  const admin = await freePort();
  const file = path.join(dir, 'envoy.json');
  fs.writeFileSync(
    file,
    JSON.stringify(adsBootstrap({ nodeId: NODE_ID, adminPort: admin, delta: kind === 'delta', xdsAddress: socket })),
  );
  const proc = spawn(envoyBin(), ['-c', file, '--disable-hot-restart', '--concurrency', '1', '-l', 'warning'], {
    cwd: dir,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  proc.stdout!.on('data', (d) => (out += d));
  proc.stderr!.on('data', (d) => (out += d));
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  await waitFor(
    "Envoy's admin port",
    async () => (await httpRequest(`http://127.0.0.1:${admin}/ready`, { timeoutMs: 500 })).status > 0,
    15_000,
    100,
  ).catch((err) => {
    proc.kill('SIGKILL');
    throw new Error(`${(err as Error).message}\nEnvoy output:\n${out}`);
  });
  return {
    admin,
    proc,
    output: () => out,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
      await exited;
    },
  };
}

interface World {
  dir: TempDir;
  cp: ControlPlane;
  modules: ModuleServer;
  wasm: WasmEcds;
  proxy: XdsProxy;
  envoy: Envoy;
  url: string;
  logs: string[];
  metrics(): Promise<string>;
  done(): Promise<void>;
}

async function world(kind: Kind, cache: Partial<WasmCacheOptions> = {}, plugins = [PLUGIN]): Promise<World> {
  const dir = tempDir('pa-wasm-ecds-');
  const logs: string[] = [];
  configureLogging({ write: (l) => logs.push(l) });
  const cleanup: Array<() => Promise<void> | void> = [() => dir.cleanup(), () => resetLogging()];
  const done = async () => {
    for (const f of cleanup.reverse()) await f();
  };
  try {
    const modules = new ModuleServer();
    await modules.start();
    cleanup.push(() => modules.close());
    modules.files.set('/a.wasm', MODULE_A);
    modules.files.set('/b.wasm', MODULE_B);
    const cp = new ControlPlane();
    await cp.start(0);
    cleanup.push(() => cp.stop());
    const listenPort = await freePort();
    cp.set(CLUSTER, 'c1', []);
    cp.set(LISTENER, 'l1', [ecdsListener(listenPort, plugins)]);
    const wasm = new WasmEcds({
      dir: path.join(dir.path, 'wasm'),
      moduleExpiryMs: 24 * 3600_000,
      purgeIntervalMs: 3600_000,
      httpTimeoutMs: 2_000,
      httpMaxRetries: 2,
      maxBytes: 1024 * 1024,
      insecureRegistries: new Set(),
      isBlocked: blockList('169.254.169.254/32'),
      ...cache,
    });
    await wasm.start();
    cleanup.push(() => wasm.close());
    const registry = newRegistry({ defaultMetrics: false });
    wasm.registerMetrics(registry);
    const socket = path.join(dir.path, 'XDS');
    const proxy = new XdsProxy({
      socketPath: socket,
      upstream: { address: cp.address, tls: false },
      backoff: { initialMs: 100, maxMs: 500 },
    });
    proxy.registerRewriter(ECDS, wasm.rewrite);
    await proxy.start();
    cleanup.push(() => proxy.close());
    const envoy = await startEnvoy(dir.path, kind, socket);
    cleanup.push(() => envoy.stop());
    return {
      dir,
      cp,
      modules,
      wasm,
      proxy,
      envoy,
      url: `http://127.0.0.1:${listenPort}/`,
      logs,
      metrics: () => registry.metrics(),
      done,
    };
  } catch (e) {
    await done();
    throw e;
  }
}

/** The listener's answer once it serves (it warms until ECDS arrives). */
interface Answer {
  status: number;
  /** x-wasm */
  header?: string;
  /** x-other */
  other?: string;
}

async function answer(w: World, pred: (r: Answer) => boolean = () => true): Promise<Answer> {
  return waitFor(
    'an answer through the ECDS filter',
    async () => {
      const r = await new Promise<Answer | undefined>((resolve) => {
        const req = http.get(w.url, { timeout: 1000 }, (res) => {
          res.resume();
          res.on('end', () =>
            resolve({
              status: res.statusCode ?? 0,
              header: res.headers['x-wasm'] as string | undefined,
              other: res.headers['x-other'] as string | undefined,
            }),
          );
        });
        req.on('error', () => resolve(undefined));
        req.on('timeout', () => req.destroy());
      });
      return r && pred(r) ? r : undefined;
    },
    20_000,
    100,
  ).catch((e: Error) => {
    throw new Error(`${e.message}\nEnvoy:\n${w.envoy.output()}\nagent:\n${w.logs.join('')}`);
  });
}

const ecdsAcks = (w: World) => w.cp.requests.filter((q) => q.typeUrl === ECDS && q.nonce !== '' && !q.error);
const ecdsNacks = (w: World) => w.cp.requests.filter((q) => q.typeUrl === ECDS && q.error);

async function configDump(w: World): Promise<string> {
  return (await httpRequest(`http://127.0.0.1:${w.envoy.admin}/config_dump?resource=ecds_filters`)).body;
}

for (const kind of ['sotw', 'delta'] as const) {
  test(`${kind}: a remote Wasm module is fetched once, runs in Envoy from a local file, ISTIO_META_* never reaches Envoy, and a changed plugin is applied`, async () => {
    const w = await world(kind);
    try {
      w.cp.set(ECDS, 'v1', [
        wasmPluginResource(PLUGIN, {
          url: w.modules.url('/a.wasm'),
          sha256: sha(MODULE_A),
          failurePolicy: 'FAIL_CLOSED',
          env: {
            ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION: '7',
            ISTIO_META_WASM_IMAGE_PULL_POLICY: 'IfNotPresent',
            KEEP_ME: 'yes',
          },
        }),
      ]);
      const r = await answer(w, (x) => x.header === 'one');
      assert.is(r.status, 200);
      assert.is(w.modules.hit('/a.wasm'), 1);
      const dump = await configDump(w);
      assert.match(dump, /"filename": "[^"]*\/wasm\/[0-9a-f]{64}\/[0-9a-f]{64}\.wasm"/);
      assert.not.match(dump, /ISTIO_META/);
      assert.match(dump, /KEEP_ME/, "the plugin's own environment is kept");
      assert.not.match(dump, /"remote"/);
      await waitFor('Envoy ACKs the ECDS', () => ecdsAcks(w).length > 0);
      assert.is(ecdsNacks(w).length, 0);

      // The same module pushed again (a new version of the config): no second fetch.
      w.cp.set(ECDS, 'v2', [
        wasmPluginResource(PLUGIN, {
          url: w.modules.url('/a.wasm'),
          sha256: sha(MODULE_A),
          failurePolicy: 'FAIL_CLOSED',
          env: { ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION: '8' },
        }),
      ]);
      if (kind === 'sotw') await waitFor('Envoy ACKs v2', () => ecdsAcks(w).some((q) => q.versionInfo === 'v2'));
      else await waitFor('Envoy ACKs the second push', () => ecdsAcks(w).length >= 2);
      assert.is(w.modules.hit('/a.wasm'), 1, 'the cached module is reused');

      // A changed plugin (a new module): Envoy runs it, same process, no NACK.
      const pid = w.envoy.proc.pid;
      w.cp.set(ECDS, 'v3', [
        wasmPluginResource(PLUGIN, {
          url: w.modules.url('/b.wasm'),
          sha256: sha(MODULE_B),
          failurePolicy: 'FAIL_CLOSED',
        }),
      ]);
      assert.is((await answer(w, (x) => x.header === 'two')).status, 200);
      assert.is(w.envoy.proc.pid, pid);
      assert.is(w.envoy.proc.exitCode, null);
      assert.is(ecdsNacks(w).length, 0);
      assert.is(w.proxy.metrics().xds_proxy_envoy_nacks_total, 0);

      const files = fs.readdirSync(path.join(w.dir.path, 'wasm'));
      for (const d of files) {
        assert.match(d, /^[0-9a-f]{64}$/);
        assert.is(fs.statSync(path.join(w.dir.path, 'wasm', d)).mode & 0o777, 0o700);
        for (const f of fs.readdirSync(path.join(w.dir.path, 'wasm', d))) {
          assert.match(f, /^[0-9a-f]{64}\.wasm$/);
          assert.is(fs.statSync(path.join(w.dir.path, 'wasm', d, f)).mode & 0o777, 0o600);
        }
      }
      const m = await w.metrics();
      assert.match(m, /istio_agent_wasm_remote_fetch_count\{result="success"\} 2/);
      assert.match(m, /istio_agent_wasm_cache_lookup_count\{hit="true"\} [1-9]/);
      assert.match(m, /istio_agent_wasm_config_conversion_count\{result="success"\} 3/);
      assert.match(m, /istio_agent_wasm_cache_entries 2/);
    } finally {
      await w.done();
    }
  });
}

test('sotw: wrong sha256 with FAIL_OPEN: Envoy ACKs the allow-all stand-in, traffic flows without the plugin', async () => {
  const w = await world('sotw');
  try {
    w.cp.set(ECDS, 'v1', [
      wasmPluginResource(PLUGIN, { url: w.modules.url('/a.wasm'), sha256: sha(MODULE_B), failurePolicy: 'FAIL_OPEN' }),
    ]);
    const r = await answer(w);
    assert.is(r.status, 200);
    assert.is(r.header, undefined);
    await waitFor('Envoy ACKs the stand-in', () => ecdsAcks(w).length > 0);
    assert.is(ecdsNacks(w).length, 0);
    assert.match(await configDump(w), /wasm-default-allow/);
    assert.match(await w.metrics(), /istio_agent_wasm_remote_fetch_count\{result="checksum_mismatched"\} 1/);
    assert.match(await w.metrics(), /istio_agent_wasm_config_conversion_count\{result="fetch_failure"\} 1/);
    assert.ok(
      w.logs.some((l) => /ns\.plugin.*checksum_mismatched.*allow-all/.test(l)),
      w.logs.join(''),
    );
  } finally {
    await w.done();
  }
});

test('sotw: wrong sha256 with FAIL_CLOSED: the deny-all stand-in answers 403; a later push with the right sha256 brings the plugin back', async () => {
  const w = await world('sotw');
  try {
    w.cp.set(ECDS, 'v1', [
      wasmPluginResource(PLUGIN, {
        url: w.modules.url('/a.wasm'),
        sha256: sha(MODULE_B),
        failurePolicy: 'FAIL_CLOSED',
      }),
    ]);
    assert.is((await answer(w)).status, 403);
    assert.match(await configDump(w), /wasm-default-deny/);
    // Pushed again with the same error: logged once.
    w.cp.set(ECDS, 'v2', [
      wasmPluginResource(PLUGIN, {
        url: w.modules.url('/a.wasm'),
        sha256: sha(MODULE_B),
        failurePolicy: 'FAIL_CLOSED',
      }),
    ]);
    await waitFor('Envoy ACKs v2', () => ecdsAcks(w).some((q) => q.versionInfo === 'v2'));
    assert.is(w.logs.filter((l) => /checksum_mismatched/.test(l) && /warn/.test(l)).length, 1, w.logs.join(''));
    w.cp.set(ECDS, 'v3', [
      wasmPluginResource(PLUGIN, {
        url: w.modules.url('/a.wasm'),
        sha256: sha(MODULE_A),
        failurePolicy: 'FAIL_CLOSED',
      }),
    ]);
    assert.is((await answer(w, (x) => x.header === 'one')).status, 200);
    assert.is(ecdsNacks(w).length, 0);
  } finally {
    await w.done();
  }
});

test('sotw: module server down (FAIL_CLOSED: 403) and a module over ISTIO_WASM_MAX_BINARY_SIZE_BYTES (FAIL_OPEN: 200 without it)', async () => {
  const w = await world('sotw', { maxBytes: MODULE_A.length - 1 });
  try {
    const deadPort = await freePort();
    w.cp.set(ECDS, 'v1', [
      wasmPluginResource(PLUGIN, { url: `http://127.0.0.1:${deadPort}/a.wasm`, failurePolicy: 'FAIL_CLOSED' }),
    ]);
    assert.is((await answer(w)).status, 403);
    assert.match(await w.metrics(), /istio_agent_wasm_remote_fetch_count\{result="download_failure"\} 1/);
    w.cp.set(ECDS, 'v2', [wasmPluginResource(PLUGIN, { url: w.modules.url('/a.wasm'), failurePolicy: 'FAIL_OPEN' })]);
    const r = await answer(w, (x) => x.status === 200);
    assert.is(r.header, undefined);
    assert.is(w.modules.hit('/a.wasm'), 1, 'a body over the cap is not retried');
    assert.ok(
      w.logs.some((l) => /ISTIO_WASM_MAX_BINARY_SIZE_BYTES/.test(l)),
      w.logs.join(''),
    );
    assert.is(ecdsNacks(w).length, 0);
  } finally {
    await w.done();
  }
});

test('BLOCKED_CIDRS_IN_WASM_FETCH parsing: the default list, IPv4-mapped addresses, host names, and each bad entry named', () => {
  const blocked = blockList('169.254.169.254/32,fd00:ec2::254/128, 10.0.0.0/8 ');
  for (const a of ['169.254.169.254', 'fd00:ec2::254', 'FD00:EC2:0:0:0:0:0:254', '::ffff:169.254.169.254', '10.1.2.3'])
    assert.ok(blocked(a), a);
  for (const a of ['169.254.169.253', 'fd00:ec2::255', '11.0.0.1', 'metadata.google.internal', '', '::', 'fd00:zz::1'])
    assert.not.ok(blocked(a), a);
  assert.not.ok(blockList('none')('169.254.169.254'));
  assert.not.ok(blockList('')('10.0.0.1'));
  for (const bad of [
    '10.0.0.0/33',
    '::/129',
    '10.0.0/8',
    '10.0.0.256/32',
    'fd00:zz::/64',
    'example.com/32',
    '10.0.0.1',
    '/8',
  ])
    assert.throws(
      () => blockList(`10.0.0.0/8,${bad}`),
      (e: Error) => e.message === `${JSON.stringify(bad)} is not a CIDR (a.b.c.d/n or an IPv6 prefix)`,
      bad,
    );
});

test('sotw: BLOCKED_CIDRS_IN_WASM_FETCH: a blocked address, a host name resolving to one, and a redirect to one are never connected to', async () => {
  const w = await world('sotw', { isBlocked: blockList('127.0.0.2/32,::1/128') });
  try {
    w.modules.files.set('/c.wasm', MODULE_A);
    // A redirect from an allowed address to a blocked one.
    const target = encodeURIComponent(`http://127.0.0.2:${w.modules.port}/c.wasm`);
    w.cp.set(ECDS, 'v1', [
      wasmPluginResource(PLUGIN, { url: w.modules.url(`/redirect/${target}`), failurePolicy: 'FAIL_CLOSED' }),
    ]);
    assert.is((await answer(w)).status, 403);
    assert.is(w.modules.hit('/c.wasm'), 0);
    assert.ok(
      w.logs.some((l) => /127\.0\.0\.2 is in BLOCKED_CIDRS_IN_WASM_FETCH/.test(l)),
      w.logs.join(''),
    );
    // The blocked address itself, FAIL_OPEN.
    w.cp.set(ECDS, 'v2', [
      wasmPluginResource(PLUGIN, { url: `http://127.0.0.2:${w.modules.port}/c.wasm`, failurePolicy: 'FAIL_OPEN' }),
    ]);
    await answer(w, (x) => x.status === 200 && x.header === undefined);
    assert.is(w.modules.hit('/c.wasm'), 0);
    assert.is(ecdsNacks(w).length, 0);
  } finally {
    await w.done();
  }
});

test('sotw: while a module is being fetched, other types flow (a new cluster reaches Envoy), and the held ECDS follows', async () => {
  const w = await world('sotw');
  try {
    w.cp.set(ECDS, 'v1', [
      wasmPluginResource(PLUGIN, {
        url: w.modules.url('/hold/a.wasm'),
        sha256: sha(MODULE_A),
        failurePolicy: 'FAIL_CLOSED',
      }),
    ]);
    await waitFor('the fetch to start', () => w.modules.hit('/hold/a.wasm') === 1);
    w.cp.set(CLUSTER, 'c2', [
      {
        name: 'other',
        any: packAny('envoy.config.cluster.v3.Cluster', {
          name: 'other',
          type: 'STATIC',
          connect_timeout: { seconds: 1 },
        }),
      },
    ]);
    await waitFor('Envoy ACKs c2 while ECDS is held', () =>
      w.cp.requests.some((q) => q.typeUrl === CLUSTER && q.versionInfo === 'c2'),
    );
    assert.is(ecdsAcks(w).length, 0, 'ECDS is still held');
    w.modules.release();
    assert.is((await answer(w, (x) => x.header === 'one')).status, 200);
  } finally {
    await w.done();
  }
});

for (const kind of ['sotw', 'delta'] as const) {
  test(`${kind}: two plugins in one push: the one whose module is cached reaches Envoy while the other is still being fetched`, async () => {
    const w = await world(kind, {}, [PLUGIN, 'ns.second']);
    try {
      const other2 = headerModule('x-other', '2');
      const other3 = headerModule('x-other', '3');
      const three = headerModule('x-wasm', 'three');
      w.modules.files.set('/o2.wasm', other2);
      w.modules.files.set('/o3.wasm', other3);
      w.modules.files.set('/three.wasm', three);
      const push = (v: string, first: string, second: string) =>
        w.cp.set(ECDS, v, [
          wasmPluginResource(PLUGIN, { url: w.modules.url(first), failurePolicy: 'FAIL_CLOSED' }),
          wasmPluginResource('ns.second', { url: w.modules.url(second), failurePolicy: 'FAIL_CLOSED' }),
        ]);
      push('v1', '/a.wasm', '/o2.wasm');
      await answer(w, (x) => x.header === 'one' && x.other === '2');
      // The second plugin's new module is already cached (an earlier push, another proxy's plugin).
      await w.wasm.cache.get(w.modules.url('/o3.wasm'), {
        checksum: '',
        resourceName: 'x',
        resourceVersion: '',
        requestTimeoutMs: 5000,
        pullPolicy: 'Unspecified',
      });
      push('v2', '/hold/three.wasm', '/o3.wasm');
      const mid = await answer(w, (x) => x.other === '3');
      assert.is(mid.header, 'one', 'the first plugin keeps its module while its new one is fetched');
      assert.is(w.modules.hit('/hold/three.wasm'), 1);
      w.modules.release();
      const end = await answer(w, (x) => x.header === 'three');
      assert.is(end.other, '3');
      assert.is(ecdsNacks(w).length, 0);
      assert.is(w.proxy.metrics().xds_proxy_envoy_nacks_total, 0);
    } finally {
      await w.done();
    }
  });
}

test('a resource that is not a TypedExtensionConfig is NACKed upstream by the agent; Envoy never sees it', async () => {
  const w = await world('sotw');
  try {
    w.cp.set(ECDS, 'bad', [
      { name: PLUGIN, any: { type_url: 'type.googleapis.com/google.protobuf.Empty', value: new Uint8Array() } },
    ]);
    const nack = await w.cp.waitForRequest("the agent's NACK", (q) => q.typeUrl === ECDS && !!q.error);
    assert.match(nack.error!, /want type\.googleapis\.com\/envoy\.config\.core\.v3\.TypedExtensionConfig/);
    assert.is(
      w.proxy.metrics().xds_proxy_rewrite_nacks_total,
      1,
      JSON.stringify(w.cp.requests.filter((q) => q.typeUrl === ECDS)),
    );
    assert.match(await w.metrics(), /istio_agent_wasm_config_conversion_count\{result="unmarshal_failure"\} 1/);
    w.cp.set(ECDS, 'v1', [wasmPluginResource(PLUGIN, { url: w.modules.url('/a.wasm'), sha256: sha(MODULE_A) })]);
    assert.is((await answer(w, (x) => x.header === 'one')).status, 200);
  } finally {
    await w.done();
  }
});

test('the whole agent: a WasmPlugin change is applied with no new Envoy epoch; the module is in <configPath>/wasm; istio_agent_wasm_* on the status port', async () => {
  const fixture = await agentFixture({ prefix: 'pa-wasm-agent-' });
  const status = fixture.ports.status;
  const modules = new ModuleServer();
  await modules.start();
  modules.files.set('/a.wasm', MODULE_A);
  modules.files.set('/b.wasm', MODULE_B);
  const cp = new ControlPlane();
  await cp.start();
  const listenPort = await freePort();
  const configPath = path.join(fixture.dir.path, 'proxy');
  // Readiness needs listeners the control plane sends only later in the test.
  const agent = await fixture.start({
    proxyConfig: { discoveryAddress: cp.address, controlPlaneAuthPolicy: 'NONE' },
    env: { POD_NAME: 'client-1', POD_NAMESPACE: 'ns', WASM_HTTP_REQUEST_MAX_RETRIES: '2' },
    ready: 'none',
  });
  const epochs = async () =>
    JSON.parse((await httpRequest(`http://127.0.0.1:${status}/debug/epochs`)).body).epochs as Array<{
      epoch: number;
      state: string;
    }>;
  const get = (): Promise<{ status: number; header?: string } | undefined> =>
    new Promise((resolve) => {
      const req = http.get(`http://127.0.0.1:${listenPort}/`, { timeout: 1000 }, (res) => {
        res.resume();
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, header: res.headers['x-wasm'] as string | undefined }),
        );
      });
      req.on('error', () => resolve(undefined));
      req.on('timeout', () => req.destroy());
    });
  try {
    await waitFor(
      'Envoy subscribed through the agent',
      () => cp.requests.some((r) => r.typeUrl === CLUSTER),
      20_000,
    ).catch((e: Error) => {
      throw new Error(`${e.message}\n${agent.log()}`);
    });
    // Delta: an empty set is never pushed, so one cluster for Envoy's CDS to finish with.
    cp.set(CLUSTER, 'c1', [
      {
        name: 'other',
        any: packAny('envoy.config.cluster.v3.Cluster', {
          name: 'other',
          type: 'STATIC',
          connect_timeout: { seconds: 1 },
        }),
      },
    ]);
    cp.set(LISTENER, 'l1', [ecdsListener(listenPort)]);
    cp.set(ECDS, 'v1', [
      wasmPluginResource(PLUGIN, { url: modules.url('/a.wasm'), sha256: sha(MODULE_A), failurePolicy: 'FAIL_CLOSED' }),
    ]);
    await waitFor('the plugin runs', async () => (await get())?.header === 'one', 20_000, 100).catch((e: Error) => {
      const seen = cp.requests.map((q) => `${q.typeUrl.split('.').pop()} ${q.nonce} ${q.error ?? ''}`).join('\n');
      throw new Error(`${e.message}\n${seen}\n${agent.log()}`);
    });
    const before = await epochs();
    cp.set(ECDS, 'v2', [
      wasmPluginResource(PLUGIN, { url: modules.url('/b.wasm'), sha256: sha(MODULE_B), failurePolicy: 'FAIL_CLOSED' }),
    ]);
    await waitFor('the changed plugin runs', async () => (await get())?.header === 'two', 20_000, 100);
    const after = await epochs();
    assert.equal(
      after.map((e) => e.epoch),
      [0],
      JSON.stringify(after),
    );
    assert.equal(
      before.map((e) => e.epoch),
      [0],
    );
    assert.is(after[0]!.state, 'live');
    const dirs = fs.readdirSync(path.join(configPath, 'wasm'));
    assert.is(dirs.length, 2, 'one directory per module name (URL)');
    const m = (await httpRequest(`http://127.0.0.1:${status}/stats/prometheus`)).body;
    assert.match(m, /istio_agent_wasm_remote_fetch_count\{result="success"\} 2/);
    assert.match(m, /istio_agent_wasm_config_conversion_count\{result="success"\} 2/);
    assert.match(m, /istio_agent_wasm_cache_entries 2/);
    assert.match(m, /istio_agent_wasm_config_conversion_duration_bucket/);
    assert.ok(!cp.requests.some((q) => q.typeUrl === ECDS && q.error), 'no NACK');
    const debug = JSON.parse((await httpRequest(`http://127.0.0.1:${status}/debug/wasm`)).body);
    assert.is(debug.cacheEntries, 2);
    assert.equal(debug.failing, {});
  } finally {
    await fixture.close();
    await cp.stop();
    await modules.close();
  }
});

test.run();

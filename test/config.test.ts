import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { buildConfig, parseDownwardApi, type Flags } from '../lib/config';
import { parseDuration } from '../lib/duration';

function cfg(opts: { flags?: Flags; env?: Record<string, string>; files?: Record<string, string> } = {}) {
  return buildConfig({ flags: opts.flags ?? {}, env: opts.env ?? {}, readFile: (f) => opts.files?.[f] });
}

function throwsMatching(fn: () => unknown, re: RegExp) {
  try {
    fn();
  } catch (e) {
    assert.match((e as Error).message, re);
    assert.is((e as { code?: string }).code, 'CONFIG_INVALID');
    return;
  }
  assert.unreachable(`expected an error matching ${re}`);
}

test('defaults match Istio ProxyConfig defaults', () => {
  const c = cfg();
  assert.is(c.proxy.configPath, './etc/istio/proxy');
  assert.is(c.proxy.binaryPath, '/usr/local/bin/envoy');
  assert.is(c.proxy.drainDuration, 45_000);
  assert.is(c.proxy.terminationDrainDuration, 5_000);
  assert.is(c.proxy.parentShutdownDuration, 60_000);
  assert.is(c.proxy.proxyAdminPort, 15000);
  assert.is(c.proxy.statusPort, 15020);
  assert.is(c.proxy.discoveryAddress, 'istiod.istio-system.svc:15012');
  assert.is(c.proxyType, 'sidecar');
  assert.is(c.proxyLogLevel, 'warning');
  assert.is(c.xdsSocket, 'etc/istio/proxy/XDS');
  assert.ok(Object.isFrozen(c) && Object.isFrozen(c.proxy));
});

test('layers: mesh file < PROXY_CONFIG < env < flags', () => {
  const c = cfg({
    files: { './etc/istio/config/mesh': 'defaultConfig:\n  drainDuration: 10s\n  statusPort: 16020\n  concurrency: 4\n' },
    env: { PROXY_CONFIG: '{"statusPort": 17020, "terminationDrainDuration": "1m30s"}', ISTIO_CPU_LIMIT: '8' },
    flags: { concurrency: 2 },
  });
  assert.is(c.proxy.drainDuration, 10_000);
  assert.is(c.proxy.statusPort, 17020);
  assert.is(c.proxy.terminationDrainDuration, 90_000);
  assert.is(c.concurrency, 2);
  assert.is(c.sources.statusPort, 'environment variable PROXY_CONFIG');
  assert.is(c.sources.drainDuration, 'mesh config ./etc/istio/config/mesh');
});

test('ISTIO_CPU_LIMIT fills an unset concurrency', () => {
  assert.is(cfg({ env: { ISTIO_CPU_LIMIT: '3' } }).concurrency, 3);
  assert.is(cfg().concurrency, undefined);
});

test('PROXY_CONFIG accepts YAML', () => {
  assert.is(cfg({ env: { PROXY_CONFIG: 'drainDuration: 500ms\n' } }).proxy.drainDuration, 500);
});

test('proxyLogLevel splits level and components', () => {
  const c = cfg({ flags: { proxyLogLevel: 'info,misc:error', proxyComponentLogLevel: 'upstream:debug' } });
  assert.is(c.proxyLogLevel, 'info');
  assert.is(c.componentLogLevel, 'misc:error,upstream:debug');
});

test('ingress runs as a router', () => {
  const c = cfg({ flags: { proxyType: 'ingress' } });
  assert.is(c.proxyType, 'router');
  assert.is(c.requestedType, 'ingress');
});

test('durations in protobuf and Go forms', () => {
  assert.is(parseDuration('45s'), 45_000);
  assert.is(parseDuration('1m30s'), 90_000);
  assert.is(parseDuration('500ms'), 500);
  assert.is(parseDuration('1.5s'), 1500);
  assert.is(parseDuration('0'), 0);
  assert.throws(() => parseDuration('5 seconds'));
});

test('the mesh config\'s outboundTrafficPolicy.mode reaches the embedded discovery server; a bad mode is named', () => {
  assert.is(cfg().outboundTrafficPolicy, 'ALLOW_ANY');
  const mesh = (t: string) => ({ files: { './etc/istio/config/mesh': t } });
  assert.is(cfg(mesh('outboundTrafficPolicy:\n  mode: REGISTRY_ONLY\n')).outboundTrafficPolicy, 'REGISTRY_ONLY');
  throwsMatching(() => cfg(mesh('outboundTrafficPolicy:\n  mode: DENY\n')), /outboundTrafficPolicy\.mode \(from mesh config .*\): "DENY" is not ALLOW_ANY or REGISTRY_ONLY/);
});

test('the mesh config\'s tracing fields reach the embedded discovery server; a bad one is named', () => {
  const mesh = (t: string) => ({ flags: { standalone: '/srv/mesh' }, files: { './etc/istio/config/mesh': t } });
  assert.is(cfg().meshTracing, undefined);
  assert.equal(cfg(mesh('enableTracing: true\ndefaultConfig:\n  tracing:\n    sampling: 50\n')).meshTracing, { enableTracing: true, defaultConfig: { sampling: 50, customTags: {} } });
  throwsMatching(() => cfg(mesh('defaultProviders:\n  tracing: [x]\n')), /mesh config .*: defaultProviders\.tracing\[0\]: names no entry of extensionProviders/);
});

test('without --standalone the mesh config\'s tracing is not read: a provider istiod supports and the embedded server does not is no error', () => {
  const otel = 'defaultProviders:\n  tracing: [otel]\nextensionProviders:\n- name: otel\n  opentelemetry: {service: otel.istio-system.svc.cluster.local, port: 4317}\n';
  assert.is(cfg({ files: { './etc/istio/config/mesh': otel } }).meshTracing, undefined);
  throwsMatching(() => cfg({ flags: { standalone: '/srv/mesh' }, files: { './etc/istio/config/mesh': otel } }), /tracing provider "opentelemetry" is not supported/);
});

test('bad input names the field and its source', () => {
  throwsMatching(() => cfg({ env: { PROXY_CONFIG: '{"drainDuration": "forever"}' } }), /drainDuration \(from environment variable PROXY_CONFIG\)/);
  throwsMatching(() => cfg({ env: { PROXY_CONFIG: '{not json' } }), /PROXY_CONFIG/);
  throwsMatching(() => cfg({ env: { PROXY_CONFIG: '{"statusPort": 70000}' } }), /statusPort .*out of range/);
  throwsMatching(() => cfg({ env: { PROXY_CONFIG: '{"noSuchField": 1, "statusPort": 0}' } }), /statusPort .*out of range/);
  throwsMatching(() => cfg({ files: { './etc/istio/config/mesh': 'defaultConfig: [1' } }), /mesh config/);
  throwsMatching(() => cfg({ files: { './etc/istio/config/mesh': 'defaultConfig:\n  proxyAdminPort: 0\n' } }), /proxyAdminPort \(from mesh config/);
  throwsMatching(() => cfg({ flags: { meshConfig: '/nope/mesh' } }), /meshConfig .*does not exist/);
  throwsMatching(() => cfg({ flags: { proxyType: 'gateway' } }), /unknown proxy type "gateway"/);
  throwsMatching(() => cfg({ flags: { proxyLogLevel: 'loud' } }), /proxyLogLevel/);
  throwsMatching(() => cfg({ env: { ISTIO_DELTA_XDS: 'maybe' } }), /ISTIO_DELTA_XDS/);
  throwsMatching(() => cfg({ env: { ENVOY_STATUS_PORT: '99999' } }), /ENVOY_STATUS_PORT/);
  throwsMatching(() => cfg({ env: { PROXY_CONFIG: 'drainDuration: 90s\nparentShutdownDuration: 60s' } }), /parentShutdownDuration .*longer than drainDuration/);
  assert.is(cfg({ env: { PROXY_CONFIG: 'drainDuration: 90s' } }).proxy.parentShutdownDuration, 105_000, 'a long drain alone is fine (Istio has no parent shutdown time)');
  throwsMatching(() => cfg({ flags: { concurrency: -1 } }), /concurrency/);
});

test('pod annotations: proxy.istio.io/config and status port', () => {
  const ann = 'proxy.istio.io/config="{\\"drainDuration\\":\\"20s\\"}"\nstatus.sidecar.istio.io/port="15030"\n';
  const c = cfg({ files: { './etc/istio/pod/annotations': ann, './etc/istio/pod/labels': 'app="web"\nversion="v1"' } });
  assert.is(c.proxy.drainDuration, 20_000);
  assert.is(c.proxy.statusPort, 15030);
  assert.equal({ ...c.podLabels }, { app: 'web', version: 'v1' });
  assert.equal({ ...parseDownwardApi('a="x\\"y"\n') }, { a: 'x"y' });
});

test.run();

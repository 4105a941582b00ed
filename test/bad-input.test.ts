// Values that parse but cannot run, and input built to hurt: each is refused up front with one message that
// names the field and where its value came from (issue 9, "Correctness and bad input").

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { buildConfig, type Flags } from '../lib/config';
import { MAX_TIMER_MS, parseDuration } from '../lib/duration';
import * as envs from '../lib/env';
import { quote } from '../lib/errors';
import { mkdirs } from '../lib/fs-atomic';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { buildNodeIdentity } from '../lib/node-identity';
import { mergeBootstrapOverride } from '../lib/bootstrap';
import { renderGoTemplate } from '../lib/go-template';
import { parseConfigFile } from '../lib/discovery/yaml-file';
import { proxyFromNode } from '../lib/discovery/proxy';

function cfg(opts: { flags?: Flags; env?: Record<string, string>; files?: Record<string, string> } = {}) {
  return buildConfig({ flags: opts.flags ?? {}, env: opts.env ?? {}, readFile: (f) => opts.files?.[f] });
}

function rejects(fn: () => unknown, re: RegExp): string {
  try {
    fn();
  } catch (e) {
    const msg = (e as Error).message;
    assert.match(msg, re);
    assert.is((e as { code?: string }).code, 'CONFIG_INVALID', msg);
    assert.not.match(msg, /\n/, 'one line');
    return msg;
  }
  assert.unreachable(`expected an error matching ${re}`);
  return '';
}

const pc = (o: Record<string, unknown>) => ({ PROXY_CONFIG: JSON.stringify(o) });

// ---- item 11: durations a timer cannot hold ----

test('a duration longer than a timer can hold is refused, naming the field and its source', () => {
  rejects(() => cfg({ env: pc({ terminationDrainDuration: '1000h' }) }), /^invalid terminationDrainDuration \(from environment variable PROXY_CONFIG\): "1000h" is longer than the longest supported duration, 596h31m23\.647s$/);
  rejects(() => cfg({ env: pc({ drainDuration: 3e6 }) }), /^invalid drainDuration \(from environment variable PROXY_CONFIG\): 3000000 seconds is longer/);
  rejects(() => cfg({ files: { './etc/istio/config/mesh': 'defaultConfig:\n  parentShutdownDuration: 99999999999999999999h\n' } }), /parentShutdownDuration \(from mesh config .*\): .* is longer than/);
  rejects(() => cfg({ env: pc({ fileFlushInterval: '600h' }) }), /fileFlushInterval/);
});

test('the longest timer is accepted, one millisecond more is not', () => {
  assert.is(parseDuration('596h31m23.647s'), MAX_TIMER_MS);
  assert.throws(() => parseDuration('596h31m23.648s'), /longer than the longest supported duration/);
  assert.is(cfg({ env: pc({ terminationDrainDuration: '596h31m23.647s', drainDuration: '1s', parentShutdownDuration: '2s' }) }).proxy.terminationDrainDuration, MAX_TIMER_MS);
});

test('every duration environment variable refuses what a timer cannot hold', () => {
  for (const v of [envs.MINIMUM_DRAIN_DURATION, envs.MAXIMUM_DRAIN_DURATION, envs.ENVOY_START_TIMEOUT, envs.ENVOY_RESTART_INITIAL_BACKOFF, envs.FILE_DEBOUNCE_DURATION, envs.PILOT_DEBOUNCE_MAX]) {
    rejects(() => v.get({ [v.name]: '1000h' }), new RegExp(`^invalid ${v.name} \\(from environment variable ${v.name}\\): "1000h" is longer`));
  }
  rejects(() => cfg({ env: { MAXIMUM_DRAIN_DURATION: '1000h' } }), /MAXIMUM_DRAIN_DURATION/);
  // A certificate lifetime is not a timer: 90 days stays valid.
  assert.is(envs.SECRET_TTL.get({ SECRET_TTL: '2160h' }), 2160 * 3_600_000);
});

test('quote() cuts long values and says how long they were', () => {
  assert.is(quote('abc'), '"abc"');
  const q = quote('x'.repeat(50_000_000));
  assert.ok(q.length < 260, q.slice(0, 300));
  assert.match(q, /\.\.\. \(50000000 characters\)$/);
  assert.is(quote(Infinity), 'Infinity');
  assert.match(quote({ a: 'y'.repeat(1000) }, 50), /^\{"a":"y+\.\.\. \(1008 characters\)$/);
});

// ---- item 12: infinite and other non-durations ----

test('drainDuration: .inf is refused as drainDuration, not blamed on parentShutdownDuration', () => {
  const m = rejects(() => cfg({ env: { PROXY_CONFIG: 'drainDuration: .inf\n' } }), /^invalid drainDuration \(from environment variable PROXY_CONFIG\): Infinity seconds is not a finite duration$/);
  assert.not.match(m, /Infinitys|parentShutdownDuration/);
  rejects(() => cfg({ env: { PROXY_CONFIG: 'parentShutdownDuration: .inf\n' } }), /^invalid parentShutdownDuration .*not a finite duration$/);
  rejects(() => cfg({ env: { PROXY_CONFIG: 'terminationDrainDuration: .nan\n' } }), /^invalid terminationDrainDuration .*NaN seconds is not a finite duration$/);
  rejects(() => cfg({ env: { PROXY_CONFIG: 'drainDuration: -5\n' } }), /^invalid drainDuration .*: -5 seconds is negative$/);
});

test('parentShutdownDuration not above drainDuration is explained in Go duration form', () => {
  rejects(() => cfg({ env: pc({ drainDuration: '90s', parentShutdownDuration: '1m30s' }) }), /^invalid parentShutdownDuration \(from environment variable PROXY_CONFIG\): 1m30s must be longer than drainDuration \(1m30s from environment variable PROXY_CONFIG\)/);
});

// ---- item 8: values that pass each field's check but cannot run ----

test('concurrency must be a whole number of worker threads Envoy can start', () => {
  rejects(() => cfg({ env: pc({ concurrency: 1e30 }) }), /^invalid concurrency \(from environment variable PROXY_CONFIG\): .*got 1e\+30$/);
  rejects(() => cfg({ env: pc({ concurrency: -1 }) }), /^invalid concurrency .*got -1$/);
  rejects(() => cfg({ env: pc({ concurrency: 1.5 }) }), /^invalid concurrency .*got 1\.5$/);
  rejects(() => cfg({ env: pc({ concurrency: 5000 }) }), /^invalid concurrency .*5000 is above the maximum 1024/);
  rejects(() => cfg({ flags: { concurrency: 1e30 } }), /^invalid concurrency \(from --concurrency\)/);
  rejects(() => cfg({ flags: { concurrency: -2 } }), /^invalid concurrency \(from --concurrency\)/);
  rejects(() => cfg({ env: { ISTIO_CPU_LIMIT: '100000' } }), /^invalid concurrency \(from environment variable ISTIO_CPU_LIMIT\): 100000 is above/);
  rejects(() => cfg({ env: { ISTIO_CPU_LIMIT: '99999999999999999999' } }), /^invalid ISTIO_CPU_LIMIT .*is not an integer/);
  assert.is(cfg({ env: pc({ concurrency: 1024 }) }).concurrency, 1024);
  assert.is(cfg({ flags: { concurrency: 0 } }).concurrency, 0);
});

test('two of the agent\'s and Envoy\'s ports that collide are refused, blaming the one that was set', () => {
  rejects(() => cfg({ env: pc({ proxyAdminPort: 15090 }) }), /^invalid proxyAdminPort \(from environment variable PROXY_CONFIG\): port 15090 is also ENVOY_PROMETHEUS_PORT, Envoy's Prometheus listener \(from default\)/);
  rejects(() => cfg({ env: pc({ proxyAdminPort: 15021 }) }), /^invalid proxyAdminPort .*: port 15021 is also ENVOY_STATUS_PORT/);
  rejects(() => cfg({ env: pc({ proxyAdminPort: 15020 }) }), /^invalid proxyAdminPort .*: port 15020 is also statusPort/);
  rejects(() => cfg({ env: { ENVOY_STATUS_PORT: '15020' } }), /^invalid ENVOY_STATUS_PORT \(from environment variable ENVOY_STATUS_PORT\): port 15020 is also statusPort, the agent's status server \(from default\)/);
  rejects(() => cfg({ env: { ENVOY_PROMETHEUS_PORT: '15021' } }), /^invalid ENVOY_PROMETHEUS_PORT .*also ENVOY_STATUS_PORT/);
  rejects(() => cfg({ env: { ...pc({ statusPort: 16000 }), ENVOY_STATUS_PORT: '16000' } }), /^invalid ENVOY_STATUS_PORT .*port 16000 is also statusPort.*\(from environment variable PROXY_CONFIG\)/);
  rejects(() => cfg({ env: { ...pc({ proxyMetadata: { ENVOY_PROMETHEUS_PORT: '15000' } }) } }), /^invalid ENVOY_PROMETHEUS_PORT \(from proxyMetadata.ENVOY_PROMETHEUS_PORT in environment variable PROXY_CONFIG\)/);
  rejects(() => cfg({ env: { ISTIO_META_ENABLE_DNS_SERVER: 'true', DNS_PROXY_ADDR: 'localhost:15020' } }), /^invalid DNS_PROXY_ADDR .*port 15020 is also statusPort/);
  rejects(() => cfg({ env: { ISTIO_META_ENABLE_DNS_SERVER: 'true', DNS_PROXY_ADDR: 'localhost:99999' } }), /^invalid DNS_PROXY_ADDR .*1-65535/);
  rejects(() => cfg({ env: { ENVOY_SECURE_METRICS_PORT: '15090' } }), /^invalid ENVOY_SECURE_METRICS_PORT \(from environment variable ENVOY_SECURE_METRICS_PORT\): port 15090 is also ENVOY_PROMETHEUS_PORT/);
  rejects(() => cfg({ env: { ENVOY_SECURE_MERGED_METRICS_PORT: '70000' } }), /^invalid ENVOY_SECURE_MERGED_METRICS_PORT .*out of range/);
  // The old single check still holds.
  rejects(() => cfg({ env: pc({ statusPort: 15000 }) }), /^invalid statusPort .*also proxyAdminPort/);
  cfg({ env: { ...pc({ proxyAdminPort: 16000, statusPort: 16001 }), ENVOY_STATUS_PORT: '16002', ENVOY_PROMETHEUS_PORT: '16003' } });
});

test('ports outside 1-65535 are refused wherever they come from', () => {
  for (const port of [0, 65536, -1, 99999]) {
    rejects(() => cfg({ env: pc({ proxyAdminPort: port }) }), /^invalid proxyAdminPort .*out of range 1-65535/);
    rejects(() => cfg({ env: pc({ statusPort: port }) }), /^invalid statusPort .*out of range 1-65535/);
    rejects(() => cfg({ env: { ENVOY_STATUS_PORT: String(port) } }), /^invalid ENVOY_STATUS_PORT \(from environment variable ENVOY_STATUS_PORT\).*out of range 1-65535/);
    rejects(() => cfg({ env: { ENVOY_PROMETHEUS_PORT: String(port) } }), /^invalid ENVOY_PROMETHEUS_PORT .*out of range 1-65535/);
  }
  rejects(() => cfg({ files: { './etc/istio/pod/annotations': 'status.sidecar.istio.io/port="70000"\n' } }), /^invalid statusPort \(from annotation status.sidecar.istio.io\/port\)/);
});

// ---- item 10: discoveryAddress ----

test('a discoveryAddress the xDS proxy cannot dial is refused at startup', () => {
  const bad: [string, RegExp][] = [
    ['garbage', /"garbage" is not an address; want host:port, \[IPv6\]:port or unix:\/\/\/path/],
    ['host:99999', /port "99999" is out of range 1-65535/],
    ['host:0', /port "0" is out of range/],
    ['host:', /port "" is out of range/],
    [':15012', /"" is not a host name/],
    ['http://istiod:15012', /has a URL scheme/],
    ['https://istiod.istio-system.svc:15012', /has a URL scheme/],
    ['bad host:15012', /"bad host" is not a host name/],
    ['[::1:15012', /is not an address/],
    ['[not-v6]:15012', /"not-v6" is not a host name or IP address/],
    ['::1:15012', /is not an address/],
    ['unix://relative.sock', /unix:\/\/ takes an absolute path/],
    ['unix:', /names no socket path/],
    ['x'.repeat(100_000), /"x{200}"\.\.\. \(100000 characters\) is not an address/],
  ];
  for (const [addr, re] of bad) {
    const m = rejects(() => cfg({ env: pc({ discoveryAddress: addr }) }), /^invalid discoveryAddress \(from environment variable PROXY_CONFIG\): /);
    assert.match(m, re, addr.slice(0, 50));
    assert.ok(m.length < 400, 'short message');
  }
  rejects(() => cfg({ files: { './etc/istio/pod/annotations': 'sidecar.istio.io/discoveryAddress="istiod"\n' } }), /^invalid discoveryAddress \(from annotation sidecar.istio.io\/discoveryAddress\)/);
  for (const ok of ['istiod.istio-system.svc:15012', '127.0.0.1:15010', '[::1]:15012', '[fd00::1]:443', 'localhost:1', 'unix:///run/xds.sock', 'unix:/run/xds.sock', 'unix:rel.sock', 'istiod.istio-system.svc.cluster.local.:15012']) {
    assert.is(cfg({ env: pc({ discoveryAddress: ok }) }).proxy.discoveryAddress, ok);
  }
  assert.is(cfg().proxy.discoveryAddress, 'istiod.istio-system.svc:15012');
});

// ---- item 13: prototype pollution through user-supplied objects ----

const HOST = [{ address: '10.0.0.1', family: 'IPv4' as const, internal: false }];

test('ISTIO_METAJSON_* with __proto__ cannot remove or replace node metadata', () => {
  const env = { POD_NAMESPACE: 'shop', POD_NAME: 'web-1', ISTIO_METAJSON_X: '{"__proto__":{"NAMESPACE":"evil","NAME":"evil","SERVICE_ACCOUNT":"evil"},"APP":"web"}' };
  const c = cfg({ env: { ...env, SERVICE_ACCOUNT: 'sa' } });
  const node = buildNodeIdentity(c, { ...env, SERVICE_ACCOUNT: 'sa' }, HOST, '1.0.0');
  const meta = JSON.parse(JSON.stringify(node.metadata));
  assert.is(meta.NAMESPACE, 'shop');
  assert.is(meta.NAME, 'web-1');
  assert.is(meta.SERVICE_ACCOUNT, 'sa');
  assert.is(meta.APP, 'web');
  assert.equal(meta.__proto__, { NAMESPACE: 'evil', NAME: 'evil', SERVICE_ACCOUNT: 'evil' }, 'kept as a plain key, as Go would');
  assert.is(({} as Record<string, unknown>).NAMESPACE, undefined, 'Object.prototype untouched');
  const labels = buildNodeIdentity(cfg({ env: { ISTIO_METAJSON_LABELS: '{"__proto__":{"app":"evil"},"app":"web"}' } }), { ISTIO_METAJSON_LABELS: '{"__proto__":{"app":"evil"},"app":"web"}' }, HOST, '1').metadata.LABELS as Record<string, unknown>;
  assert.is(labels.app, 'web');
});

test('__proto__ and constructor in PROXY_CONFIG, proxyMetadata and annotations are keys, not prototypes', () => {
  // Unknown fields, as to Istio's ApplyJSON: warned about and dropped (see crash-proxy-config.test.ts).
  assert.is(cfg({ env: { PROXY_CONFIG: '{"__proto__": {"statusPort": 1}}' } }).proxy.statusPort, 15020);
  assert.equal(Object.keys(cfg({ env: { PROXY_CONFIG: 'constructor: 1\n' } }).proxy.extra), []);
  const c = cfg({ env: { PROXY_CONFIG: '{"proxyMetadata": {"__proto__": "x", "ISTIO_META_A": "b"}}' } });
  assert.equal(Object.keys(c.proxy.proxyMetadata).sort(), ['ISTIO_META_A', '__proto__']);
  const a = cfg({ files: { './etc/istio/pod/annotations': '__proto__="x"\nconstructor="y"\n', './etc/istio/pod/labels': '__proto__="z"\n' } });
  assert.is(a.podAnnotations.__proto__, 'x');
  assert.is(a.podAnnotations.constructor, 'y');
  assert.is(a.podLabels.__proto__, 'z');
});

test('a bootstrap override with __proto__ does not change the merged object\'s prototype', () => {
  const merged = mergeBootstrapOverride({ admin: { a: 1 } }, JSON.parse('{"__proto__": {"admin": {"evil": true}}, "node": {"__proto__": {"id": "evil"}}}'));
  assert.equal((merged.admin as Record<string, unknown>).a, 1);
  assert.is(Object.getPrototypeOf(merged), Object.prototype);
  assert.is((merged.node as Record<string, unknown>).id, undefined);
  assert.ok(Object.hasOwn(merged, '__proto__'), 'kept as a field, for Envoy to reject');
});

test('a bootstrap template cannot reach Object.prototype through {{ .constructor }}', () => {
  let out = '';
  try {
    out = renderGoTemplate('{"x": "{{ .constructor }}", "y": "{{ .__proto__ }}"}', { a: 1 });
  } catch (e) {
    out = (e as Error).message;
  }
  assert.not.match(out, /function|Object|\[object/);
});

test('discovery YAML and xDS node metadata with __proto__ keys are data', () => {
  const yaml = 'apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: a\n  labels:\n    __proto__: x\n    app: a\nspec:\n  hosts: [a.example]\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  resolution: STATIC\n  endpoints: [{address: 10.0.0.1}]\n';
  const r = parseConfigFile('a.yaml', yaml);
  assert.equal(r.issues, []);
  assert.equal(Object.keys(r.configs[0]!.meta.labels).sort(), ['__proto__', 'app']);
  // What protobufjs gives for a Struct whose key is "__proto__": an own property.
  const fields = JSON.parse('{"__proto__": {"structValue": {"fields": {"LABELS": {"structValue": {"fields": {"app": {"stringValue": "evil"}}}}}}}}');
  const node = { id: 'sidecar~10.0.0.1~a.ns~ns.svc.cluster.local', metadata: { fields } };
  assert.equal({ ...proxyFromNode(node).labels }, {});
});

// ---- item 16: configPath under /proc ----

test('creating a directory under /proc or /sys fails at once instead of looping forever', () => {
  assert.throws(() => mkdirs('/proc/foo'), /cannot create directory \/proc\/foo: ENOENT/);
  assert.throws(() => mkdirs('/proc/foo/bar/baz'), /cannot create directory \/proc\/foo\/bar\/baz: ENOENT.*'\/proc\/foo'/);
  assert.throws(() => mkdirs('/dev/null/x'), /cannot create directory \/dev\/null\/x/);
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'mkdirs-'));
  try {
    mkdirs(path.join(tmp, 'a/b/c'));
    mkdirs(path.join(tmp, 'a/b/c'));
    assert.ok(fs.statSync(path.join(tmp, 'a/b/c')).isDirectory());
    fs.writeFileSync(path.join(tmp, 'file'), '');
    assert.throws(() => mkdirs(path.join(tmp, 'file')), /is not a directory/);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
});

test.run();

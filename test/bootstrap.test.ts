// The generated bootstrap, pinned by golden files, plus the loader (custom config, template, override) and the
// atomic file write. Golden files live in test/golden/; after an intended change, refresh them with
//   REFRESH_GOLDEN=1 npx uvu -r tsx test bootstrap
// and review the diff before committing.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { buildConfig, type Flags } from '../lib/config';
import { buildNodeIdentity, type HostAddress } from '../lib/node-identity';
import { buildBootstrap, mergeBootstrapOverride, renderBootstrap, runtimeFlags, DEFAULT_MAX_DOWNSTREAM_CONNECTIONS } from '../lib/bootstrap';
import { resolveBootstrap } from '../lib/bootstrap-loader';
import { writeFileAtomic } from '../lib/fs-atomic';
import { tempDir } from './helpers/harness';

type Json = Record<string, any>;

const GOLDEN_DIR = path.join(__dirname, 'golden');
const HOSTS: HostAddress[] = [
  { address: '127.0.0.1', family: 'IPv4', internal: true },
  { address: '10.44.0.7', family: 'IPv4', internal: false },
  { address: '192.168.5.9', family: 'IPv4', internal: false },
];
const BASE_ENV = { POD_NAME: 'web-7d9f8-abcde', POD_NAMESPACE: 'shop', INSTANCE_IP: '10.44.0.7', SERVICE_ACCOUNT: 'web' };
const LABELS = 'app="web"\nversion="v1"\n';

/** Fixed inputs: the same config and node identity on every machine. */
function fixture(opts: { env?: Record<string, string>; flags?: Flags; files?: Record<string, string>; hosts?: HostAddress[] } = {}) {
  const env = { ...BASE_ENV, ...opts.env };
  const cfg = buildConfig({ flags: opts.flags ?? {}, env, readFile: (f) => opts.files?.[f] });
  const node = buildNodeIdentity(cfg, env, opts.hosts ?? HOSTS, '1.0.0-test');
  return { cfg, node };
}

function bootstrapOf(opts: Parameters<typeof fixture>[0] = {}): Json {
  return buildBootstrap(fixture(opts));
}

function checkGolden(name: string, b: Record<string, unknown>) {
  const file = path.join(GOLDEN_DIR, `${name}.json`);
  const actual = renderBootstrap(b);
  if (process.env.REFRESH_GOLDEN === '1') {
    fs.mkdirSync(GOLDEN_DIR, { recursive: true });
    fs.writeFileSync(file, actual);
    return;
  }
  assert.ok(fs.existsSync(file), `golden file ${file} is missing; create it with REFRESH_GOLDEN=1`);
  assert.fixture(actual, fs.readFileSync(file, 'utf8'), `${name} bootstrap differs from ${file} (REFRESH_GOLDEN=1 to accept)`);
}

function throwsConfig(fn: () => unknown, ...patterns: RegExp[]) {
  try {
    fn();
  } catch (e) {
    for (const re of patterns) assert.match((e as Error).message, re);
    assert.is((e as { code?: string }).code, 'CONFIG_INVALID');
    return;
  }
  assert.unreachable(`expected a CONFIG_INVALID error matching ${patterns.join(' and ')}`);
}

const cluster = (b: Json, name: string) => (b.static_resources.clusters as Json[]).find((c) => c.name === name);
const patterns = (b: Json) => b.stats_config.stats_matcher.inclusion_list.patterns as Json[];
const tagNames = (b: Json) => (b.stats_config.stats_tags as Json[]).map((t) => t.tag_name);

// ---- golden files ----

test('golden: sidecar', () => {
  checkGolden('sidecar', bootstrapOf({ files: { './etc/istio/pod/labels': LABELS } }));
});

test('golden: router', () => {
  checkGolden('router', bootstrapOf({ flags: { proxyType: 'router' }, env: { POD_NAME: 'istio-ingressgateway-5c7f9-x2x2x', POD_NAMESPACE: 'istio-system' } }));
});

test('golden: sidecar with tracing, stats options, SotW and custom runtime', () => {
  checkGolden(
    'sidecar-options',
    bootstrapOf({
      env: {
        ISTIO_DELTA_XDS: 'false',
        EXIT_ON_ZERO_ACTIVE_CONNECTIONS: 'true',
        PROXY_CONFIG: JSON.stringify({
          tracing: { zipkin: { address: 'zipkin.istio-system:9411' }, sampling: 10 },
          extraStatTags: ['request_path'],
          proxyStatsMatcher: { inclusionPrefixes: ['http.{pod_ip}_'], inclusionRegexps: ['.*upstream_rq_retry.*'] },
          runtimeValues: { 'overload.global_downstream_max_connections': '10000', 're2.max_program_size.error_level': '', 'envoy.reloadable_features.x': 'true' },
        }),
      },
      flags: { outlierLogPath: '/dev/stdout' },
      files: { './etc/istio/pod/annotations': 'sidecar.istio.io/statsHistogramBuckets="{\\"istiocustom\\":[1,5,10]}"\n' },
    }),
  );
});

// ---- sections ----

test('admin listens on loopback at proxyAdminPort, access log discarded', () => {
  const b = bootstrapOf();
  assert.equal(b.admin.address, { socket_address: { address: '127.0.0.1', port_value: 15000 } });
  assert.is(b.admin.access_log[0].typed_config.path, '/dev/null');
});

test('node: id, cluster and metadata come from the node identity', () => {
  const { cfg, node } = fixture({ env: { ISTIO_META_FOO: 'bar' } });
  const b: Json = buildBootstrap({ cfg, node });
  assert.is(b.node.id, 'sidecar~10.44.0.7~web-7d9f8-abcde.shop~shop.svc.cluster.local');
  assert.is(b.node.cluster, 'istio-proxy.shop', 'no app label in this fixture: istio-proxy.<namespace>, as Istio');
  assert.is(b.node.metadata.FOO, 'bar');
  assert.equal(b.node.metadata, node.metadata);
  b.node.metadata.FOO = 'changed';
  assert.is(node.metadata.FOO, 'bar', 'the bootstrap must not share objects with the node identity');
});

test('ADS: delta by default, state of the world with ISTIO_DELTA_XDS=false', () => {
  const delta = bootstrapOf();
  assert.is(delta.dynamic_resources.ads_config.api_type, 'DELTA_GRPC');
  assert.is(delta.dynamic_resources.ads_config.set_node_on_first_message_only, true);
  assert.is(delta.dynamic_resources.ads_config.transport_api_version, 'V3');
  assert.equal(delta.dynamic_resources.lds_config, { ads: {}, initial_fetch_timeout: '0s', resource_api_version: 'V3' });
  assert.equal(delta.dynamic_resources.cds_config, { ads: {}, initial_fetch_timeout: '0s', resource_api_version: 'V3' });
  assert.is(bootstrapOf({ env: { ISTIO_DELTA_XDS: 'false' } }).dynamic_resources.ads_config.api_type, 'GRPC');
});

test('xds-grpc and sds-grpc clusters reach the agent over its Unix sockets with HTTP/2', () => {
  const b = bootstrapOf({ env: { PROXY_CONFIG: '{"configPath": "/run/pa"}' } });
  const xds = cluster(b, 'xds-grpc')!;
  assert.equal(xds.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address, { pipe: { path: '/run/pa/XDS' } });
  const opts = xds.typed_extension_protocol_options['envoy.extensions.upstreams.http.v3.HttpProtocolOptions'];
  assert.equal(opts.explicit_http_config, { http2_protocol_options: {} });
  assert.is(opts.common_http_protocol_options.max_requests_per_connection, 1);
  assert.is(xds.circuit_breakers.thresholds.length, 2);
  assert.is(xds.upstream_connection_options.tcp_keepalive.keepalive_time, 300);
  const sds = cluster(b, 'sds-grpc')!;
  assert.equal(sds.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address, { pipe: { path: './var/run/secrets/workload-spiffe-uds/socket' } });
});

test('custom ports reach the admin, clusters and listeners', () => {
  const b = bootstrapOf({ env: { PROXY_CONFIG: '{"proxyAdminPort": 16000, "statusPort": 16020}', ENVOY_STATUS_PORT: '16021', ENVOY_PROMETHEUS_PORT: '16090' } });
  assert.is(b.admin.address.socket_address.port_value, 16000);
  const port = (name: string) => cluster(b, name)!.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.port_value;
  assert.is(port('prometheus_stats'), 16000);
  assert.is(port('agent'), 16020);
  const listeners = b.static_resources.listeners as Json[];
  assert.equal(listeners.map((l) => l.name), ['0.0.0.0_16090', '0.0.0.0_16021']);
  const route = (l: Json) => l.filter_chains[0].filters[0].typed_config.route_config.virtual_hosts[0].routes[0];
  assert.equal(route(listeners[0]!).match.path, '/stats/prometheus');
  assert.equal(route(listeners[0]!).route, { cluster: 'prometheus_stats' });
  assert.equal(route(listeners[1]!).match.path, '/healthz/ready');
  assert.equal(route(listeners[1]!).route, { cluster: 'agent' });
  assert.ok(listeners.every((l) => l.ignore_global_conn_limit === true && l.bypass_overload_manager === true));
});

test('IPv6-only pod: loopback ::1, wildcard ::', () => {
  const b = bootstrapOf({ env: { INSTANCE_IP: 'fd00::7' }, hosts: [{ address: 'fd00::7', family: 'IPv6', internal: false }] });
  assert.is(b.admin.address.socket_address.address, '::1');
  assert.is(cluster(b, 'agent')!.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.address, '::1');
  assert.equal((b.static_resources.listeners as Json[]).map((l) => l.address.socket_address.address), ['::', '::']);
});

test('router and sidecar differ only in the node', () => {
  const side = bootstrapOf();
  const router = bootstrapOf({ flags: { proxyType: 'router' } });
  assert.ok(String(router.node.id).startsWith('router~'));
  delete side.node;
  delete router.node;
  assert.equal(router, side);
});

test('stats: Istio tags, required inclusions, and ProxyConfig additions', () => {
  const b = bootstrapOf({ env: { PROXY_CONFIG: JSON.stringify({ extraStatTags: ['app_tag', ''], proxyStatsMatcher: { inclusionPrefixes: ['upstream_cx'], inclusionSuffixes: ['_retry'] } }) } });
  assert.is(b.stats_config.use_all_default_tags, false);
  const names = tagNames(b);
  assert.ok(names.includes('cluster_name') && names.includes('response_code') && names.includes('authz_dry_run_result'));
  assert.ok(names.indexOf('app_tag') > names.indexOf('mongo_prefix') && names.indexOf('app_tag') < names.indexOf('cache'));
  assert.equal((b.stats_config.stats_tags as Json[]).find((t) => t.tag_name === 'app_tag'), { tag_name: 'app_tag', regex: '(app_tag=\\.=(.*?);\\.;)' });
  const p = patterns(b);
  assert.equal(p[0], { prefix: 'reporter=' });
  assert.equal(p.slice(-2), [{ prefix: 'component' }, { prefix: 'istio' }]);
  for (const want of ['upstream_cx', 'cluster_manager', 'listener_manager', 'server', 'cluster.xds-grpc', 'wasm']) assert.ok(p.some((x) => x.prefix === want), want);
  for (const want of ['_retry', 'rbac.allowed', 'rbac.denied', 'shadow_allowed', 'shadow_denied']) assert.ok(p.some((x) => x.suffix === want), want);
  assert.ok(p.some((x) => x.safe_regex?.regex === 'vhost\\..*\\.route\\..*'));
  assert.not.ok(p.some((x) => x.suffix === 'downstream_cx_active'));
});

test('stats: pod annotations replace ProxyConfig lists; {pod_ip} expands to every pod IP', () => {
  const ann = [
    'sidecar.istio.io/statsInclusionPrefixes="http.{pod_ip}_,tls_inspector"',
    'sidecar.istio.io/extraStatTags="a_tag,b_tag"',
  ].join('\n');
  const b = bootstrapOf({ env: { PROXY_CONFIG: '{"proxyStatsMatcher": {"inclusionPrefixes": ["from_config"]}, "extraStatTags": ["a_tag"]}' }, files: { './etc/istio/pod/annotations': ann } });
  const prefixes = patterns(b).filter((x) => x.prefix).map((x) => x.prefix);
  assert.ok(prefixes.includes('http.10.44.0.7_') && prefixes.includes('http.192.168.5.9_') && prefixes.includes('tls_inspector'));
  assert.not.ok(prefixes.includes('from_config'));
  assert.is(tagNames(b).filter((n) => n === 'a_tag').length, 1, 'duplicate tags are dropped');
  assert.ok(tagNames(b).includes('b_tag'));
});

test('stats: EXIT_ON_ZERO_ACTIVE_CONNECTIONS keeps downstream_cx_active for the drain', () => {
  assert.ok(patterns(bootstrapOf({ env: { EXIT_ON_ZERO_ACTIVE_CONNECTIONS: 'true' } })).some((x) => x.suffix === 'downstream_cx_active'));
});

test('stats: histogram buckets and flush interval annotations', () => {
  const ann = 'sidecar.istio.io/statsHistogramBuckets="{\\"b\\":[1,2],\\"a\\":[0.5]}"\nsidecar.istio.io/statsFlushInterval="10s"\n';
  const b = bootstrapOf({ files: { './etc/istio/pod/annotations': ann } });
  assert.equal(b.stats_config.histogram_bucket_settings, [{ match: { prefix: 'a' }, buckets: [0.5] }, { match: { prefix: 'b' }, buckets: [1, 2] }]);
  assert.is(b.stats_flush_interval, '10s');
  throwsConfig(() => bootstrapOf({ files: { './etc/istio/pod/annotations': 'sidecar.istio.io/statsHistogramBuckets="{nope"\n' } }), /sidecar\.istio\.io\/statsHistogramBuckets/, /not valid JSON/);
  throwsConfig(() => bootstrapOf({ files: { './etc/istio/pod/annotations': 'sidecar.istio.io/statsFlushInterval="soon"\n' } }), /statsFlushInterval/);
});

test('runtime: Istio defaults, runtimeValues override, "" removes, booleans typed', () => {
  const layer = (b: Json) => b.layered_runtime.layers[0].static_layer as Json;
  const def = bootstrapOf();
  assert.is(layer(def)['re2.max_program_size.error_level'], '32768');
  assert.is(def.layered_runtime.layers[1].name, 'admin');
  assert.equal(def.layered_runtime.layers[1].admin_layer, {});
  const b = bootstrapOf({ env: { PROXY_CONFIG: JSON.stringify({ runtimeValues: { 're2.max_program_size.error_level': '', 'x.flag': 'false', 'x.num': '12' } }) } });
  assert.not.ok('re2.max_program_size.error_level' in layer(b));
  assert.is(layer(b)['x.flag'], false);
  assert.is(layer(b)['x.num'], '12');
});

test('overload manager carries the global connection limit; the runtimeValues key stays in the runtime layer too', () => {
  const limit = (b: Json) => b.overload_manager?.resource_monitors[0].typed_config.max_active_downstream_connections;
  assert.is(limit(bootstrapOf()), DEFAULT_MAX_DOWNSTREAM_CONNECTIONS);
  const rv = (v: string) => ({ env: { PROXY_CONFIG: JSON.stringify({ runtimeValues: { 'overload.global_downstream_max_connections': v } }) } });
  const b = bootstrapOf(rv('5000'));
  assert.is(limit(b), 5000);
  assert.is(b.layered_runtime.layers[0].static_layer['overload.global_downstream_max_connections'], '5000');
  assert.is(limit(bootstrapOf(rv(''))), DEFAULT_MAX_DOWNSTREAM_CONNECTIONS);
  const meta = { env: { PROXY_CONFIG: JSON.stringify({ proxyMetadata: { ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS: '77' }, runtimeValues: { 'overload.global_downstream_max_connections': '5000' } }) } };
  assert.is(limit(bootstrapOf(meta)), 77, 'proxyMetadata ISTIO_META_GLOBAL_DOWNSTREAM_MAX_CONNECTIONS wins');
  throwsConfig(() => bootstrapOf(rv('lots')), /overload\.global_downstream_max_connections/, /PROXY_CONFIG/);
});

test('tracing: zipkin and datadog clusters; other tracers rejected naming the field', () => {
  const tr = (t: unknown) => ({ env: { PROXY_CONFIG: JSON.stringify({ tracing: t }) } });
  const z = bootstrapOf(tr({ zipkin: { address: 'zipkin.istio-system:9411' } }));
  assert.is(z.tracing.http.name, 'envoy.tracers.zipkin');
  assert.equal(cluster(z, 'zipkin')!.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address, { address: 'zipkin.istio-system', port_value: 9411 });
  const d = bootstrapOf(tr({ datadog: { address: '[fd00::1]:8126' } }));
  assert.is(d.tracing.http.typed_config.collector_cluster, 'datadog_agent');
  assert.is(cluster(d, 'datadog_agent')!.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.address, 'fd00::1');
  assert.is(bootstrapOf(tr({ sampling: 1 })).tracing, undefined);
  throwsConfig(() => bootstrapOf(tr({ lightstep: { address: 'x:1' } })), /tracing/, /lightstep/);
  throwsConfig(() => bootstrapOf(tr({ zipkin: { address: 'no-port' } })), /tracing\.zipkin\.address/);
});

test('cluster_manager only with an outlier log path (then with deferred cluster creation, as Istio\'s template)', () => {
  assert.equal(bootstrapOf({ flags: { outlierLogPath: '/dev/stdout' } }).cluster_manager, { outlier_detection: { event_log_path: '/dev/stdout' }, enable_deferred_cluster_creation: true });
  assert.is(bootstrapOf().cluster_manager, undefined);
});

test('runtime layer has Istio\'s defaults, including its Envoy bug workaround', () => {
  const layer = bootstrapOf().layered_runtime.layers[0].static_layer;
  assert.is(layer['envoy.reloadable_features.fixed_heap_use_allocated'], true);
  assert.is(layer['envoy.reloadable_features.coalesce_lb_rebuilds_on_batch_update'], false);
});

test('runtime layer: COMPLIANCE_POLICY=fips-140-2 and HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED=false add Istio\'s flags', () => {
  const layer = (env: Record<string, string>) => bootstrapOf({ env }).layered_runtime.layers[0].static_layer;
  assert.is(layer({ COMPLIANCE_POLICY: 'fips-140-2' })['envoy.reloadable_features.google_grpc_disable_tls_13'], true);
  assert.is(layer({})['envoy.reloadable_features.google_grpc_disable_tls_13'], undefined);
  assert.is(layer({ HTTP_STRIP_FRAGMENT_FROM_PATH_UNSAFE_IF_DISABLED: 'false' })['envoy.reloadable_features.http_strip_fragment_from_path_unsafe_if_disabled'], 'false');
});

test('tracer address $(HOST_IP) is the node\'s HOST_IP, as Istio expands it', () => {
  const b = bootstrapOf({ env: { HOST_IP: '192.168.7.7', PROXY_CONFIG: JSON.stringify({ tracing: { zipkin: { address: '$(HOST_IP):9411' } } }) } });
  assert.equal(cluster(b, 'zipkin')!.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address, { address: '192.168.7.7', port_value: 9411 });
});

test('stats eviction interval from the pod annotation, a multiple of the flush interval', () => {
  const ann = (a: string) => ({ files: { './etc/istio/pod/annotations': a } });
  assert.is(bootstrapOf(ann('sidecar.istio.io/statsEvictionInterval="60s"\n')).stats_eviction_interval, '60s');
  assert.is(bootstrapOf().stats_eviction_interval, undefined);
  throwsConfig(() => bootstrapOf(ann('sidecar.istio.io/statsEvictionInterval="7s"\n')), /statsEvictionInterval/, /multiple/);
});

test('remote services: metrics service cluster and sink, access log service cluster, statsd sink, TLS by SDS', () => {
  const pc = (p: unknown) => ({ env: { PROXY_CONFIG: JSON.stringify(p) } });
  const b = bootstrapOf(pc({ envoyMetricsService: { address: 'm:15000', tcpKeepalive: { probes: 3, time: '10s' } }, envoyAccessLogService: { address: 'a:9000' }, statsdUdpAddress: '10.0.0.9:8125' }));
  assert.equal(cluster(b, 'envoy_metrics_service')!.upstream_connection_options, { tcp_keepalive: { keepalive_probes: 3, keepalive_time: 10 } });
  assert.is(cluster(b, 'envoy_accesslog_service')!.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.port_value, 9000);
  assert.equal((b.stats_sinks as Json[]).map((x) => x.name), ['envoy.stat_sinks.metrics_service', 'envoy.stat_sinks.statsd']);
  assert.is(bootstrapOf().stats_sinks, undefined);
  const tls = cluster(bootstrapOf(pc({ envoyMetricsService: { address: 'm:1', tlsSettings: { mode: 'ISTIO_MUTUAL' } } })), 'envoy_metrics_service')!.transport_socket;
  assert.is(tls.typed_config.sni, 'envoy_metrics_service');
  assert.equal(tls.typed_config.common_tls_context.alpn_protocols, ['istio', 'h2']);
  assert.is(tls.typed_config.common_tls_context.tls_certificate_sds_secret_configs[0].name, 'default');
  const z = cluster(bootstrapOf(pc({ tracing: { zipkin: { address: 'z:9411' }, tlsSettings: { mode: 'SIMPLE', caCertificates: '/ca.pem' } } })), 'zipkin')!.transport_socket;
  assert.is(z.typed_config.common_tls_context.combined_validation_context.validation_context_sds_secret_config.name, 'file-root:/ca.pem');
  assert.is(z.typed_config.common_tls_context.alpn_protocols, undefined, 'zipkin speaks HTTP/1.1');
  throwsConfig(() => bootstrapOf(pc({ envoyMetricsService: { address: 'm:1', tlsSettings: { mode: 'SOMETIMES' } } })), /envoyMetricsService\.tlsSettings\.mode/);
  throwsConfig(() => bootstrapOf(pc({ statsdUdpAddress: 'statsd.monitoring:8125' })), /statsdUdpAddress/, /IP address/);
});

test('Prometheus listener compresses with brotli, zstd and gzip unless statsCompression is false', () => {
  const filters = (b: Json) => (b.static_resources.listeners[0].filter_chains[0].filters[0].typed_config.http_filters as Json[]).map((f) => f.name);
  assert.equal(filters(bootstrapOf()), ['envoy.filters.http.compressor.brotli', 'envoy.filters.http.compressor.zstd', 'envoy.filters.http.compressor.gzip', 'envoy.filters.http.router']);
  assert.equal(filters(bootstrapOf({ env: { PROXY_CONFIG: '{"statsCompression": false}' } })), ['envoy.filters.http.router']);
});

test('buildBootstrap is deterministic', () => {
  assert.is(renderBootstrap(bootstrapOf()), renderBootstrap(bootstrapOf()));
});

// ---- override merge ----

test('mergeBootstrapOverride: objects merge, lists append, scalars and typed configs are replaced', () => {
  const base = {
    admin: { address: { socket_address: { address: '127.0.0.1', port_value: 15000 } }, profile_path: '/p' },
    static_resources: { clusters: [{ name: 'a' }] },
    tc: { typed_config: { '@type': 'type.googleapis.com/A', x: 1, y: 2 } },
  };
  const snapshot = JSON.stringify(base);
  const merged: Json = mergeBootstrapOverride(base, {
    admin: { address: { socket_address: { port_value: 16000 } } },
    static_resources: { clusters: [{ name: 'b' }] },
    tc: { typed_config: { '@type': 'type.googleapis.com/B', z: 3 } },
    stats_flush_interval: '10s',
  });
  assert.equal(merged.admin, { address: { socket_address: { address: '127.0.0.1', port_value: 16000 } }, profile_path: '/p' });
  assert.equal(merged.static_resources.clusters.map((c: Json) => c.name), ['a', 'b']);
  assert.equal(merged.tc.typed_config, { '@type': 'type.googleapis.com/B', z: 3 });
  assert.is(merged.stats_flush_interval, '10s');
  assert.is(JSON.stringify(base), snapshot, 'the base is not modified');
});

// ---- loader ----

function loader(opts: { env?: Record<string, string>; flags?: Flags; files: Record<string, string>; hosts?: HostAddress[] }) {
  const { cfg, node } = fixture(opts);
  return resolveBootstrap(cfg, node, (f) => opts.files[f]);
}

test('loader: no user files -> the generated bootstrap, no inputs', () => {
  const { cfg, node } = fixture();
  const r = resolveBootstrap(cfg, node, () => undefined);
  assert.equal(r.bootstrap, buildBootstrap({ cfg, node }));
  assert.equal(r.inputs, []);
});

test('loader: customConfigFile (JSON or YAML) is the bootstrap as written', () => {
  const custom = { node: { id: 'x', cluster: 'y' }, admin: { address: { socket_address: { address: '127.0.0.1', port_value: 9901 } } } };
  const json = loader({ env: { PROXY_CONFIG: '{"customConfigFile": "/cfg/custom.json"}' }, files: { '/cfg/custom.json': JSON.stringify(custom) } });
  assert.equal(json.bootstrap, custom);
  assert.equal(json.inputs, ['/cfg/custom.json']);
  const yaml = loader({ env: { PROXY_CONFIG: '{"customConfigFile": "/cfg/custom.yaml"}' }, files: { '/cfg/custom.yaml': 'node:\n  id: x\n  cluster: y\nadmin:\n  address:\n    socket_address: {address: 127.0.0.1, port_value: 9901}\n' } });
  assert.equal(yaml.bootstrap, custom);
});

test('loader: ISTIO_BOOTSTRAP_OVERRIDE merges over the generated bootstrap', () => {
  const override = 'static_resources:\n  clusters:\n  - name: extra\n    type: STATIC\n    connect_timeout: 1s\nadmin:\n  address:\n    socket_address:\n      port_value: 16000\n';
  const r = loader({ env: { ISTIO_BOOTSTRAP_OVERRIDE: '/cfg/override.yaml' }, files: { '/cfg/override.yaml': override } });
  const b = r.bootstrap as Json;
  assert.equal((b.static_resources.clusters as Json[]).map((c) => c.name), ['prometheus_stats', 'agent', 'sds-grpc', 'xds-grpc', 'extra']);
  assert.equal(b.admin.address.socket_address, { address: '127.0.0.1', port_value: 16000 });
  assert.equal(r.inputs, ['/cfg/override.yaml']);
});

test('loader: the override also applies to a customConfigFile', () => {
  const r = loader({
    env: { PROXY_CONFIG: '{"customConfigFile": "/c.json"}', ISTIO_BOOTSTRAP_OVERRIDE: '/o.json' },
    files: { '/c.json': '{"node": {"id": "x"}}', '/o.json': '{"node": {"cluster": "z"}}' },
  });
  assert.equal(r.bootstrap, { node: { id: 'x', cluster: 'z' } });
  assert.equal(r.inputs, ['/c.json', '/o.json']);
});

test('loader: a template is a Go text/template over Istio\'s variables (JSON text inserted as is)', () => {
  const tmpl = [
    '{',
    '  "node": {"id": "{{ .nodeID }}", "cluster": "{{.cluster}}", "metadata": {{ .meta_json_str }}},',
    '  "admin": {"address": {"socket_address": {"address": "{{ .localhost }}", "port_value": {{ .config.ProxyAdminPort }}}}},',
    '  "layered_runtime": {"layers": [{"name": "g", "static_layer": {{ .runtime_flags }}}]},',
    '  "x": ["{{ .xds_type }}", "{{ .xds_socket }}", {{ .envoy_status_port }}, "{{- .region -}}"]',
    '}',
  ].join('\n');
  const { cfg, node } = fixture({ flags: { templateFile: '/t/bootstrap.json' }, env: { ISTIO_META_QUOTED: 'say "hi"' } });
  const r = resolveBootstrap(cfg, node, (f) => (f === '/t/bootstrap.json' ? tmpl : undefined));
  const b = r.bootstrap as Json;
  assert.is(b.node.id, node.id);
  assert.is(b.node.cluster, node.cluster);
  assert.equal(b.node.metadata, node.metadata);
  assert.is(b.node.metadata.QUOTED, 'say "hi"');
  assert.equal(b.admin.address.socket_address, { address: '127.0.0.1', port_value: 15000 });
  assert.equal(b.layered_runtime.layers[0].static_layer, runtimeFlags(cfg));
  assert.equal(b.x, ['DELTA_GRPC', 'etc/istio/proxy/XDS', 15021, '<no value>'], 'a variable Istio leaves out prints <no value>, as in Go');
  assert.equal(r.inputs, ['/t/bootstrap.json']);
});

test('loader: a template at Istio\'s default path is rendered when no other is named, as the Go agent does', () => {
  const tmpl = '{"node": {"id": "{{ .nodeID }}", "cluster": "from-image"}}';
  const r = loader({ files: { './var/lib/istio/envoy/envoy_bootstrap_tmpl.json': tmpl } });
  assert.is((r.bootstrap as Json).node.cluster, 'from-image');
  assert.equal(r.inputs, ['./var/lib/istio/envoy/envoy_bootstrap_tmpl.json']);
  const named = loader({ flags: { templateFile: '/t.json' }, files: { '/t.json': '{"node": {"cluster": "named"}}', './var/lib/istio/envoy/envoy_bootstrap_tmpl.json': tmpl } });
  assert.is((named.bootstrap as Json).node.cluster, 'named');
  throwsConfig(() => loader({ files: { './var/lib/istio/envoy/envoy_bootstrap_tmpl.json': '{{ if }}' } }), /bootstrap template \(from Istio's default template path/);
});

test('loader: YAML templates work too', () => {
  const r = loader({ flags: { templateFile: '/t.yaml' }, files: { '/t.yaml': 'node:\n  id: "{{ .nodeID }}"\n  cluster: {{ .cluster }}\nadmin:\n  address: {socket_address: {address: "{{ .localhost }}", port_value: {{ .config.ProxyAdminPort }}}}\n' } });
  const b = r.bootstrap as Json;
  assert.is(b.node.cluster, 'istio-proxy.shop');
  assert.is(b.admin.address.socket_address.port_value, 15000);
});

test('loader errors name the file and the setting', () => {
  // missing files
  throwsConfig(() => loader({ env: { PROXY_CONFIG: '{"customConfigFile": "/nope.json"}' }, files: {} }), /customConfigFile/, /\/nope\.json does not exist/);
  throwsConfig(() => loader({ flags: { templateFile: '/nope.tmpl' }, files: {} }), /proxyBootstrapTemplatePath \(from --templateFile\)/, /\/nope\.tmpl/);
  throwsConfig(() => loader({ env: { ISTIO_BOOTSTRAP_OVERRIDE: '/o.yaml' }, files: {} }), /ISTIO_BOOTSTRAP_OVERRIDE/, /\/o\.yaml does not exist/);
  // bad documents
  throwsConfig(() => loader({ env: { ISTIO_BOOTSTRAP_OVERRIDE: '/o.yaml' }, files: { '/o.yaml': 'a: [1\n' } }), /ISTIO_BOOTSTRAP_OVERRIDE/, /\/o\.yaml is not valid JSON or YAML/);
  throwsConfig(() => loader({ env: { ISTIO_BOOTSTRAP_OVERRIDE: '/o.yaml' }, files: { '/o.yaml': '- 1\n- 2\n' } }), /\/o\.yaml must hold a bootstrap mapping/);
  throwsConfig(() => loader({ env: { PROXY_CONFIG: '{"customConfigFile": "/c.json"}' }, files: { '/c.json': '{"a": 1, "a": 2}' } }), /customConfigFile/, /\/c\.json is not valid/);
  throwsConfig(() => loader({ env: { PROXY_CONFIG: '{"customConfigFile": "/c.json"}' }, files: { '/c.json': '' } }), /\/c\.json must hold a bootstrap mapping/);
  // template errors name the file and line
  throwsConfig(
    () => loader({ flags: { templateFile: '/t.json' }, files: { '/t.json': '{\n "a": "{{ .nodeID }}",\n "b": {{ if .zipkin }}1\n}' } }),
    /proxyBootstrapTemplatePath/, /template \/t\.json: line 3: if has no \{\{end\}\}/,
  );
  throwsConfig(() => loader({ flags: { templateFile: '/t.json' }, files: { '/t.json': '{"a": "{{ .config.NoSuchField }}"}' } }), /line 1: can't evaluate field NoSuchField/);
  throwsConfig(() => loader({ flags: { templateFile: '/t.json' }, files: { '/t.json': '{"a": "{{ nosuchfn 1 }}"}' } }), /function "nosuchfn" not defined/);
  throwsConfig(() => loader({ flags: { templateFile: '/t.json' }, files: { '/t.json': '{"a": "{{ .nodeID"}' } }), /\/t\.json: line 1: unclosed action/);
});

test('loader: an empty override file changes nothing', () => {
  const { cfg, node } = fixture({ env: { ISTIO_BOOTSTRAP_OVERRIDE: '/o.yaml' } });
  assert.equal(resolveBootstrap(cfg, node, (f) => (f === '/o.yaml' ? '\n' : undefined)).bootstrap, buildBootstrap({ cfg, node }));
});

// ---- atomic write ----

test('writeFileAtomic writes the whole file with the asked mode and leaves no temp file', () => {
  const dir = tempDir();
  try {
    const file = path.join(dir.path, 'envoy-rev0.json');
    writeFileAtomic(file, 'old');
    writeFileAtomic(file, renderBootstrap(bootstrapOf()), 0o600);
    assert.is(fs.readFileSync(file, 'utf8'), renderBootstrap(bootstrapOf()));
    assert.is(fs.statSync(file).mode & 0o777, 0o600);
    writeFileAtomic(file, Buffer.from('{}'));
    assert.is(fs.readFileSync(file, 'utf8'), '{}');
    assert.equal(fs.readdirSync(dir.path), ['envoy-rev0.json']);
  } finally {
    dir.cleanup();
  }
});

test('writeFileAtomic: a failed rename leaves no temp file and names the file', () => {
  const dir = tempDir();
  try {
    // The target is a non-empty directory: the temp file gets written, then rename fails.
    const target = path.join(dir.path, 'envoy-rev0.json');
    fs.mkdirSync(target);
    fs.writeFileSync(path.join(target, 'keep'), 'x');
    try {
      writeFileAtomic(target, 'data');
      assert.unreachable('expected an error');
    } catch (e) {
      assert.is((e as { code?: string }).code, 'IO');
      assert.match((e as Error).message, `cannot write ${target}`);
    }
    assert.equal(fs.readdirSync(dir.path), ['envoy-rev0.json']);
  } finally {
    dir.cleanup();
  }
});

test('writeFileAtomic: an unwritable or missing directory gives a clear error and no file', () => {
  const dir = tempDir();
  try {
    const missing = path.join(dir.path, 'no-such-dir', 'envoy-rev0.json');
    assert.throws(() => writeFileAtomic(missing, 'x'), (e: Error) => /cannot write .*no-such-dir\/envoy-rev0\.json: .*ENOENT/.test(e.message));
    // Permission bits do not stop root, so only check them as an ordinary user.
    if (process.getuid?.() !== 0) {
      const ro = path.join(dir.path, 'ro');
      fs.mkdirSync(ro, 0o500);
      assert.throws(() => writeFileAtomic(path.join(ro, 'envoy-rev0.json'), 'x'), (e: Error) => /cannot write .*EACCES/.test(e.message));
      assert.equal(fs.readdirSync(ro), []);
    }
    assert.equal(fs.readdirSync(dir.path), []);
  } finally {
    dir.cleanup();
  }
});

test.run();

// ---- ENVOY_ADMIN_MODE=uds: Envoy's admin on a Unix socket ----

/** Every endpoint (cluster name -> addresses) of the static clusters. */
function endpointsOf(b: Json): Record<string, Json[]> {
  const out: Record<string, Json[]> = {};
  for (const c of b.static_resources?.clusters ?? []) {
    out[c.name] = (c.load_assignment?.endpoints ?? []).flatMap((g: Json) => (g.lb_endpoints ?? []).map((lb: Json) => lb.endpoint.address));
  }
  return out;
}

const ADMIN_SOCKET = path.resolve('etc/istio/proxy/admin/envoy-admin.sock');

test('ENVOY_ADMIN_MODE unset or tcp: the bootstrap is the one Istio writes (admin on loopback proxyAdminPort)', () => {
  const tcp = loader({ env: { ENVOY_ADMIN_MODE: 'tcp' }, files: {} }).bootstrap;
  assert.equal(tcp, loader({ files: {} }).bootstrap);
  assert.equal((tcp as Json).admin.address, { socket_address: { address: '127.0.0.1', port_value: 15000 } });
});

test('ENVOY_ADMIN_MODE=uds: admin on a 0600 socket under configPath; prometheus_stats (15090) follows it, agent (15020) does not', () => {
  const b = loader({ env: { ENVOY_ADMIN_MODE: 'uds' }, files: {} }).bootstrap as Json;
  assert.equal(b.admin.address, { pipe: { path: ADMIN_SOCKET, mode: 0o600 } });
  const eps = endpointsOf(b);
  assert.equal(eps.prometheus_stats, [{ pipe: { path: ADMIN_SOCKET } }]);
  assert.equal(eps.agent, [{ socket_address: { protocol: 'TCP', address: '127.0.0.1', port_value: 15020 } }]);
  assert.not.match(renderBootstrap(b), /"port_value": 15000\b/, 'nothing is left on the admin port');
  // Everything else is the TCP bootstrap.
  const tcp = loader({ files: {} }).bootstrap as Json;
  assert.equal({ ...b, admin: undefined, static_resources: undefined }, { ...tcp, admin: undefined, static_resources: undefined });
  // An IPv6 pod, and a custom admin port, the same.
  const v6 = loader({ env: { ENVOY_ADMIN_MODE: 'UDS', INSTANCE_IP: 'fd00::7', PROXY_CONFIG: '{"proxyAdminPort": 16000}' }, files: {}, hosts: [] }).bootstrap as Json;
  assert.equal(endpointsOf(v6).prometheus_stats, [{ pipe: { path: ADMIN_SOCKET } }]);
  assert.equal(endpointsOf(loader({ env: { INSTANCE_IP: 'fd00::7', PROXY_CONFIG: '{"proxyAdminPort": 16000}' }, files: {}, hosts: [] }).bootstrap as Json).prometheus_stats,
    [{ socket_address: { protocol: 'TCP', address: '::1', port_value: 16000 } }], 'that is, the IPv6 loopback cluster it replaced');
  assert.not.match(renderBootstrap(v6), /"port_value": 16000\b/);
});

test('ENVOY_ADMIN_MODE=uds also moves a template\'s, a custom bootstrap\'s and an override\'s admin (Istio\'s own template)', () => {
  const istio = fs.readFileSync(path.join(__dirname, 'fixtures', 'istio', 'envoy_bootstrap.json'), 'utf8');
  const t = loader({ env: { ENVOY_ADMIN_MODE: 'uds' }, flags: { templateFile: '/t.json' }, files: { '/t.json': istio } }).bootstrap as Json;
  assert.equal(t.admin.address, { pipe: { path: ADMIN_SOCKET, mode: 0o600 } });
  assert.equal(endpointsOf(t).prometheus_stats, [{ pipe: { path: ADMIN_SOCKET } }]);
  assert.not.match(renderBootstrap(t), /"port_value": 15000\b/);
  // A custom bootstrap on its own admin port: that port's loopback clusters follow, other ports stay.
  const custom = {
    admin: { address: { socket_address: { address: '0.0.0.0', port_value: 9901 } } },
    static_resources: { clusters: [
      { name: 'self', load_assignment: { endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: '127.0.0.1', port_value: 9901 } } } }] }] } },
      { name: 'remote', load_assignment: { endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: '10.0.0.1', port_value: 9901 } } } }] }] } },
    ] },
  };
  const c = loader({ env: { ENVOY_ADMIN_MODE: 'uds', PROXY_CONFIG: '{"customConfigFile": "/c.json"}' }, files: { '/c.json': JSON.stringify(custom) } }).bootstrap as Json;
  assert.equal(c.admin.address, { pipe: { path: ADMIN_SOCKET, mode: 0o600 } });
  assert.equal(endpointsOf(c), { self: [{ pipe: { path: ADMIN_SOCKET } }], remote: [{ socket_address: { address: '10.0.0.1', port_value: 9901 } }] });
  // An override that names a TCP admin address does not bring it back.
  const o = loader({ env: { ENVOY_ADMIN_MODE: 'uds', ISTIO_BOOTSTRAP_OVERRIDE: '/o.json' }, files: { '/o.json': '{"admin": {"address": {"socket_address": {"port_value": 16000}}}}' } }).bootstrap as Json;
  assert.equal(o.admin.address, { pipe: { path: ADMIN_SOCKET, mode: 0o600 } });
});

test('ENVOY_ADMIN_MODE: a bad value or a socket path too long for sun_path is a config error naming the setting', () => {
  throwsConfig(() => fixture({ env: { ENVOY_ADMIN_MODE: 'unix' } }), /^invalid ENVOY_ADMIN_MODE \(from environment variable ENVOY_ADMIN_MODE\): "unix" is not tcp or uds/);
  throwsConfig(() => fixture({ env: { PROXY_CONFIG: '{"proxyMetadata": {"ENVOY_ADMIN_MODE": "x"}}' } }), /^invalid ENVOY_ADMIN_MODE \(from proxyMetadata\.ENVOY_ADMIN_MODE/);
  const long = `/${'d'.repeat(100)}`;
  throwsConfig(() => fixture({ env: { ENVOY_ADMIN_MODE: 'uds', PROXY_CONFIG: JSON.stringify({ configPath: long }) } }), /^invalid configPath \(from environment variable PROXY_CONFIG\): with ENVOY_ADMIN_MODE=uds .* longer than the 107 bytes/);
  // With the admin on a socket, proxyAdminPort is free for another listener.
  assert.is(fixture({ env: { ENVOY_ADMIN_MODE: 'uds', PROXY_CONFIG: '{"statusPort": 15000}' } }).cfg.envoyAdminSocket, ADMIN_SOCKET);
});

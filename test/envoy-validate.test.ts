// The real Envoy checks every kind of bootstrap the agent generates: `envoy --mode validate` with the exact
// command line the supervisor would use (validate mode parses hot-restart flags but touches no shared memory,
// and needs no running agent). Without a real Envoy these tests fail; they never skip.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { buildConfig, type Flags } from '../lib/config';
import { buildNodeIdentity, type HostAddress } from '../lib/node-identity';
import { renderBootstrap } from '../lib/bootstrap';
import { resolveBootstrap } from '../lib/bootstrap-loader';
import { bootstrapFileName, envoyArgs, type BaseId } from '../lib/envoy-args';
import { writeFileAtomic } from '../lib/fs-atomic';
import { envoyBin, tempDir, type TempDir } from './helpers/harness';

// Two cores are shared with other work: validate at most two bootstraps at a time.
const PARALLEL = 2;

const V4_HOSTS: HostAddress[] = [{ address: '127.0.0.1', family: 'IPv4', internal: true }, { address: '10.44.0.7', family: 'IPv4', internal: false }];
const V6_HOSTS: HostAddress[] = [{ address: '::1', family: 'IPv6', internal: true }, { address: 'fd00::7', family: 'IPv6', internal: false }];
const BASE_ENV = { POD_NAME: 'web-1', POD_NAMESPACE: 'shop', INSTANCE_IP: '10.44.0.7' };

interface Case {
  env?: Record<string, string>;
  flags?: Flags;
  files?: Record<string, string>;
  hosts?: HostAddress[];
  epoch?: number;
  baseId?: BaseId;
}

const OVERRIDE = JSON.stringify({
  static_resources: {
    clusters: [{ name: 'extra', type: 'STATIC', connect_timeout: '1s', load_assignment: { cluster_name: 'extra', endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: '127.0.0.1', port_value: 8080 } } } }] }] } }],
  },
  stats_flush_interval: '10s',
});

const TEMPLATE = `node:
  id: "{{ .nodeID }}"
  cluster: "{{ .cluster }}"
  metadata: {{ .meta_json_str }}
admin:
  address: {socket_address: {address: "{{ .localhost }}", port_value: {{ .config.ProxyAdminPort }}}}
layered_runtime:
  layers:
  - {name: global, static_layer: {{ .runtime_flags }}}
dynamic_resources:
  ads_config: {api_type: {{ .xds_type }}, transport_api_version: V3, grpc_services: [{envoy_grpc: {cluster_name: xds-grpc}}]}
  cds_config: {ads: {}, resource_api_version: V3}
  lds_config: {ads: {}, resource_api_version: V3}
static_resources:
  clusters:
  - name: xds-grpc
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
    load_assignment:
      cluster_name: xds-grpc
      endpoints: [{lb_endpoints: [{endpoint: {address: {pipe: {path: "{{ .xds_socket }}"}}}}]}]
`;

const CASES: Record<string, Case> = {
  sidecar: {},
  router: { flags: { proxyType: 'router' } },
  'ingress gateway': { flags: { proxyType: 'ingress' } },
  'IPv6-only pod': { env: { INSTANCE_IP: 'fd00::7' }, hosts: V6_HOSTS },
  'custom ports': { env: { PROXY_CONFIG: '{"proxyAdminPort": 16000, "statusPort": 16020}', ENVOY_STATUS_PORT: '16021', ENVOY_PROMETHEUS_PORT: '16090' } },
  'metadata with JSON values, labels and annotations': {
    env: { ISTIO_METAJSON_LABELS: '{"app": "web", "nested": {"n": 1, "list": [true, null, 2.5]}}', ISTIO_META_QUOTED: 'a "quoted" \\ value', ISTIO_META_LOCALITY: 'r1/z1/s1' },
    files: { './etc/istio/pod/labels': 'app="web"\n', './etc/istio/pod/annotations': 'sidecar.istio.io/extraStatTags="x_tag"\nkubectl.kubernetes.io/last-applied="{\\"a\\":1}"\n' },
  },
  'Envoy logs as JSON (--log_as_json)': { flags: { logAsJson: true } },
  'concurrency set': { flags: { concurrency: 2, proxyLogLevel: 'info,misc:error', proxyComponentLogLevel: 'upstream:debug' } },
  'state of the world xDS': { env: { ISTIO_DELTA_XDS: 'false' } },
  'delta xDS': { env: { ISTIO_DELTA_XDS: 'true' } },
  'with an override file': { env: { ISTIO_BOOTSTRAP_OVERRIDE: '/cfg/override.json' }, files: { '/cfg/override.json': OVERRIDE } },
  'from a template': { flags: { templateFile: '/cfg/bootstrap.yaml' }, files: { '/cfg/bootstrap.yaml': TEMPLATE } },
  'tracing, stats options, runtime values, outlier log': {
    env: {
      EXIT_ON_ZERO_ACTIVE_CONNECTIONS: 'true',
      PROXY_CONFIG: JSON.stringify({
        tracing: { zipkin: { address: 'zipkin.istio-system:9411' } },
        proxyStatsMatcher: { inclusionPrefixes: ['http.{pod_ip}_'], inclusionRegexps: ['.*upstream_rq_retry.*'], inclusionSuffixes: ['upstream_cx_total'] },
        runtimeValues: { 'overload.global_downstream_max_connections': '10000', 'envoy.reloadable_features.http_reject_path_with_fragment': 'true' },
      }),
    },
    flags: { outlierLogPath: '/dev/stdout' },
    files: { './etc/istio/pod/annotations': 'sidecar.istio.io/statsHistogramBuckets="{\\"istiocustom\\":[1,5,10]}"\nsidecar.istio.io/statsFlushInterval="10s"\n' },
  },
  'datadog tracing on IPv6': { env: { INSTANCE_IP: 'fd00::7', PROXY_CONFIG: '{"tracing": {"datadog": {"address": "[fd00::1]:8126"}}}' }, hosts: V6_HOSTS },
  'hot restart epoch 3 with a fixed base id': { epoch: 3, baseId: { id: 17 } },
  'metrics service, access log service, statsd, TLS to them and to zipkin, and the mTLS scrape ports': {
    env: {
      PROXY_CONFIG: JSON.stringify({
        envoyMetricsService: { address: 'metrics.monitoring:15000', tcpKeepalive: { probes: 3, time: '10s', interval: '5s' }, tlsSettings: { mode: 'ISTIO_MUTUAL' } },
        envoyAccessLogService: { address: 'als.monitoring:9000', tlsSettings: { mode: 'MUTUAL', clientCertificate: '/c.pem', privateKey: '/k.pem', caCertificates: '/ca.pem', subjectAltNames: ['als'] } },
        tracing: { zipkin: { address: 'zipkin:9411' }, tlsSettings: { mode: 'SIMPLE', caCertificates: '/ca.pem', sni: 'zipkin.example' } },
        statsdUdpAddress: '10.0.0.9:8125',
      }),
      ENVOY_SECURE_METRICS_PORT: '15091',
      ENVOY_SECURE_MERGED_METRICS_PORT: '15092',
    },
  },
  'dual stack (ISTIO_DUAL_STACK), IPv6 first': {
    env: { INSTANCE_IP: 'fd00::7', ISTIO_DUAL_STACK: 'true', PROXY_CONFIG: '{"tracing": {"zipkin": {"address": "zipkin:9411"}}}' },
    hosts: [...V4_HOSTS, ...V6_HOSTS],
  },
  'Istio\'s stock template (ISTIO_BOOTSTRAP)': {
    env: { ISTIO_BOOTSTRAP: '/istio/envoy_bootstrap_tmpl.json', ISTIO_META_WORKLOAD_NAME: 'web', PROXY_CONFIG: '{"tracing": {"zipkin": {"address": "zipkin:9411"}}}' },
    files: { '/istio/envoy_bootstrap_tmpl.json': fs.readFileSync(path.join(__dirname, 'fixtures', 'istio', 'envoy_bootstrap.json'), 'utf8') },
  },
};

interface Outcome {
  code: number | null;
  output: string;
  args: string[];
}

let dir: TempDir | undefined;
let outcomes: Map<string, Promise<Outcome>> | undefined;

/** Writes the case's bootstrap as the agent would (into its own folder) and builds its Envoy command line. */
function prepare(name: string, c: Case, into: string): { args: string[]; caseDir: string } {
  const env = { ...BASE_ENV, ...c.env };
  const cfg = buildConfig({ flags: c.flags ?? {}, env, readFile: (f) => c.files?.[f] });
  const node = buildNodeIdentity(cfg, env, c.hosts ?? V4_HOSTS, '1.0.0-test');
  const { bootstrap } = resolveBootstrap(cfg, node, (f) => c.files?.[f]);
  const epoch = c.epoch ?? 0;
  const caseDir = path.join(into, name.replace(/[^a-z0-9]+/gi, '-'));
  fs.mkdirSync(caseDir);
  const file = path.join(caseDir, bootstrapFileName(epoch));
  writeFileAtomic(file, renderBootstrap(bootstrap));
  const baseId = c.baseId ?? { dynamic: true, path: path.join(caseDir, 'base-id') };
  return { args: envoyArgs({ cfg, configFile: file, epoch, baseId, ipv6: node.ipv6 }), caseDir };
}

/**
 * Envoy's output goes to a regular file, not a pipe: Node's pipes are socketpairs, and Envoy cannot open
 * /dev/stdout (a common access/outlier log path) when it is a socket.
 */
function validate(envoy: string, args: string[], logFile: string): Promise<Outcome> {
  const fd = fs.openSync(logFile, 'w');
  return new Promise<Outcome>((resolve) => {
    const child = spawn(envoy, [...args, '--mode', 'validate'], { stdio: ['ignore', fd, fd] });
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    const done = (code: number | null, extra = '') => {
      clearTimeout(timer);
      resolve({ code, output: fs.readFileSync(logFile, 'utf8') + extra, args });
    };
    child.on('error', (e) => done(null, `\n${e.message}`));
    child.on('exit', (code, signal) => done(code, signal ? `\nkilled by ${signal}` : ''));
  }).finally(() => fs.closeSync(fd));
}

/** Starts every validation on first use, at most PARALLEL at a time; throws if Envoy cannot be had. */
function outcomeOf(name: string): Promise<Outcome> {
  if (!outcomes) {
    const envoy = envoyBin();
    dir = tempDir('pa-validate-');
    const root = dir.path;
    const queue = Object.entries(CASES).map(([n, c]) => {
      let start!: () => void;
      const p = new Promise<Outcome>((resolve, reject) => {
        start = () => {
          try {
            const { args, caseDir } = prepare(n, c, root);
            validate(envoy, args, path.join(caseDir, 'envoy.log')).then(resolve, reject);
          } catch (e) {
            reject(e);
          }
        };
      });
      return { name: n, p, start };
    });
    outcomes = new Map(queue.map((q) => [q.name, q.p]));
    let next = 0;
    const runNext = (): void => {
      const q = queue[next++];
      if (!q) return;
      q.p.finally(runNext).catch(() => undefined);
      q.start();
    };
    for (let k = 0; k < PARALLEL; k++) runNext();
  }
  return outcomes.get(name)!;
}

for (const name of Object.keys(CASES)) {
  test(`real Envoy accepts the ${name} bootstrap and command line`, async () => {
    const o = await outcomeOf(name);
    const tail = o.output.split('\n').filter((l) => /error|invalid|exception|unknown|OK/i.test(l)).slice(-8).join('\n');
    assert.is(o.code, 0, `envoy ${o.args.join(' ')} --mode validate failed:\n${tail || o.output.slice(-2000)}`);
    assert.match(o.output, /configuration '.*' OK/);
    // Bootstrap.tracing is deprecated in Envoy, but it is how Istio applies ProxyConfig.tracing.
    const deprecated = o.output.split('\n').filter((l) => /Deprecated field/.test(l) && !/Bootstrap\.tracing'/.test(l));
    assert.equal(deprecated, [], 'the bootstrap uses no other deprecated Envoy field');
  });
}

test('an invalid bootstrap is rejected, so the checks above can fail', async () => {
  const envoy = envoyBin();
  const scratch = tempDir('pa-validate-bad-');
  try {
    const file = path.join(scratch.path, 'bad.json');
    writeFileAtomic(file, JSON.stringify({ static_resources: { clusters: [{ name: 'x', type: 'NO_SUCH_TYPE' }] } }));
    const o = await validate(envoy, ['-c', file], path.join(scratch.path, 'envoy.log'));
    assert.is.not(o.code, 0);
  } finally {
    scratch.cleanup();
  }
});

test.after(() => {
  dir?.cleanup();
});

test.run();

// Parity with the Go pilot-agent: the input sets, a run of either agent on one set with a fake Envoy that copies
// its bootstrap out, a semantic diff of two bootstraps (and of Envoy's command lines), and the allow-list of
// intended differences. Used by scripts/parity.ts (both agents, regenerates the goldens) and test/parity.test.ts
// (this agent against the committed goldens, no Go needed).

import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { pathToFileURL } from 'node:url';

export const REPO = path.resolve(__dirname, '..', '..');
export const GOLDEN_DIR = path.join(REPO, 'test', 'golden', 'parity');
export const ALLOW_FILE = path.join(GOLDEN_DIR, 'allow.json');
/** Istio's stock bootstrap template (Apache-2.0, from istio/istio; see test/fixtures/istio/README.md). */
export const ISTIO_TEMPLATE = path.join(REPO, 'test', 'fixtures', 'istio', 'envoy_bootstrap.json');
export const CUSTOM_TEMPLATE = path.join(REPO, 'test', 'fixtures', 'parity', 'custom-template.json');
const FAKE_ENVOY = path.join(REPO, 'test', 'fixtures', 'parity', 'fake-envoy.sh');

type Json = Record<string, unknown>;

export interface InputSet {
  name: string;
  what: string;
  /** pilot-agent's arguments. */
  args: string[];
  env: Record<string, string>;
  /** Files relative to the agent's working directory. */
  files?: Record<string, string>;
  /** A template placed at Istio's default path (./var/lib/istio/envoy/envoy_bootstrap_tmpl.json), as an image would. */
  imageTemplate?: string;
  /** Addresses on the pod's eth0 (none: loopback only). */
  ipv4?: string;
  ipv6?: string;
}

// What Istio's injector passes a sidecar (flags and the environment that do not depend on the cluster).
const INJECTED_FLAGS = ['--domain', 'shop.svc.cluster.local', '--proxyLogLevel=warning', '--proxyComponentLogLevel=misc:error', '--log_output_level=default:info'];
const POD_ENV = { POD_NAME: 'web-7d9f8b6c4-x2x2x', POD_NAMESPACE: 'shop', SERVICE_ACCOUNT: 'web', HOST_IP: '192.168.1.20' };

const downward = (m: Record<string, string>) => Object.entries(m).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join('\n') + '\n';

export const INPUT_SETS: InputSet[] = [
  {
    name: 'sidecar-bare',
    what: 'proxy sidecar with only the pod name and namespace, no pod address (loopback only)',
    args: ['proxy', 'sidecar'],
    env: { POD_NAME: 'web-1', POD_NAMESPACE: 'shop' },
  },
  {
    name: 'router',
    what: 'proxy router as a gateway deployment runs it',
    args: ['proxy', 'router', '--domain', 'istio-system.svc.cluster.local', '--proxyLogLevel=warning', '--proxyComponentLogLevel=misc:error', '--log_output_level=default:info'],
    env: {
      POD_NAME: 'istio-ingressgateway-5c7f9d8b7-abcde', POD_NAMESPACE: 'istio-system', SERVICE_ACCOUNT: 'istio-ingressgateway-service-account',
      INSTANCE_IP: '10.44.0.9', HOST_IP: '192.168.1.20', ISTIO_META_WORKLOAD_NAME: 'istio-ingressgateway', ISTIO_META_CLUSTER_ID: 'Kubernetes',
      ISTIO_META_OWNER: 'kubernetes://apis/apps/v1/namespaces/istio-system/deployments/istio-ingressgateway',
    },
    ipv4: '10.44.0.9',
  },
  {
    name: 'sidecar-injected',
    what: 'a typical injected pod: pod labels/annotations files, POD_PORTS, OWNER, tracing, proxyStatsMatcher, concurrency',
    args: ['proxy', 'sidecar', ...INJECTED_FLAGS],
    env: {
      ...POD_ENV,
      INSTANCE_IP: '10.44.0.7',
      JWT_POLICY: 'third-party-jwt', PILOT_CERT_PROVIDER: 'istiod', CA_ADDR: 'istiod.istio-system.svc:15012', ISTIO_CPU_LIMIT: '2',
      PROXY_CONFIG: JSON.stringify({
        concurrency: 2,
        tracing: { zipkin: { address: 'zipkin.istio-system:9411' }, sampling: 1 },
        proxyStatsMatcher: { inclusionPrefixes: ['http.{pod_ip}_'], inclusionRegexps: ['.*upstream_rq_retry.*'] },
        holdApplicationUntilProxyStarts: true,
      }),
      ISTIO_META_POD_PORTS: '[\n    {"name":"http","containerPort":8080,"protocol":"TCP"}\n]',
      ISTIO_META_APP_CONTAINERS: 'web', ISTIO_META_CLUSTER_ID: 'Kubernetes', ISTIO_META_NODE_NAME: 'node-a',
      ISTIO_META_INTERCEPTION_MODE: 'REDIRECT', ISTIO_META_WORKLOAD_NAME: 'web',
      ISTIO_META_OWNER: 'kubernetes://apis/apps/v1/namespaces/shop/deployments/web', ISTIO_META_MESH_ID: 'cluster.local', TRUST_DOMAIN: 'cluster.local',
    },
    files: {
      'etc/istio/pod/labels': downward({ app: 'web', version: 'v1', 'pod-template-hash': '7d9f8b6c4', 'security.istio.io/tlsMode': 'istio', 'service.istio.io/canonical-name': 'web', 'service.istio.io/canonical-revision': 'v1', 'topology.istio.io/locality': 'eu-west1.eu-west1-b' }),
      'etc/istio/pod/annotations': downward({
        'kubectl.kubernetes.io/default-container': 'web', 'prometheus.io/path': '/stats/prometheus', 'prometheus.io/port': '15020', 'prometheus.io/scrape': 'true',
        'sidecar.istio.io/status': '{"initContainers":["istio-init"],"containers":["istio-proxy"],"volumes":["istio-envoy","istio-data","istio-podinfo","istio-token","istiod-ca-cert"],"imagePullSecrets":null,"revision":"default"}',
        'sidecar.istio.io/statsInclusionSuffixes': 'upstream_cx_active,downstream_cx_total',
      }),
    },
    ipv4: '10.44.0.7',
  },
  {
    name: 'gateway',
    what: 'a gateway with gatewayTopology, proxyHeaders, runtimeValues, extraStatTags, metrics on localhost only, JSON logs (mesh config file and PROXY_CONFIG)',
    args: ['proxy', 'router', '--domain', 'istio-system.svc.cluster.local', '--proxyLogLevel=warning', '--log_as_json'],
    env: {
      POD_NAME: 'gw-6f7d9-zzzzz', POD_NAMESPACE: 'istio-system', INSTANCE_IP: '10.44.0.11', SERVICE_ACCOUNT: 'gw',
      ISTIO_META_WORKLOAD_NAME: 'gw', ISTIO_META_ROUTER_MODE: 'sni-dnat', ISTIO_META_UNPRIVILEGED_POD: 'true',
      PROXY_CONFIG: JSON.stringify({
        gatewayTopology: { numTrustedProxies: 2, forwardClientCertDetails: 'SANITIZE_SET' },
        proxyHeaders: { server: { disabled: true }, requestId: { disabled: true } },
        runtimeValues: { 'overload.global_downstream_max_connections': '50000', 'envoy.reloadable_features.http_reject_path_with_fragment': 'true' },
        extraStatTags: ['request_host', 'destination_port'],
        proxyMetadata: { METRICS_LOCALHOST_ACCESS_ONLY: 'true' },
      }),
    },
    files: {
      'etc/istio/config/mesh': 'defaultConfig:\n  discoveryAddress: istiod.istio-system.svc:15012\n  drainDuration: 30s\n  terminationDrainDuration: 10s\n  statNameLength: 150\n',
      'etc/istio/pod/labels': downward({ app: 'gw', istio: 'ingressgateway' }),
    },
    ipv4: '10.44.0.11',
  },
  {
    name: 'ipv6-only',
    what: 'an IPv6-only sidecar',
    args: ['proxy', 'sidecar', ...INJECTED_FLAGS],
    env: { ...POD_ENV, INSTANCE_IP: 'fd00:10:44::7' },
    ipv6: 'fd00:10:44::7',
  },
  {
    name: 'dns-capture',
    what: 'a sidecar with DNS capture and auto allocation on, an outlier log and stats annotations',
    args: ['proxy', 'sidecar', ...INJECTED_FLAGS, '--outlierLogPath', '/dev/stdout'],
    env: { ...POD_ENV, INSTANCE_IP: '10.44.0.7', ISTIO_META_DNS_CAPTURE: 'true', ISTIO_META_DNS_AUTO_ALLOCATE: 'true' },
    files: {
      'etc/istio/pod/annotations': downward({
        'sidecar.istio.io/statsHistogramBuckets': '{"istiocustom": [1, 5, 10], "cluster.xds-grpc": [1, 10, 100]}',
        'sidecar.istio.io/statsFlushInterval': '10s',
        'sidecar.istio.io/statsEvictionInterval': '30s',
        'sidecar.istio.io/extraStatTags': 'tag_a,tag_b',
      }),
    },
    ipv4: '10.44.0.7',
  },
  {
    name: 'waypoint',
    what: 'proxy waypoint (Delta xDS and peer metadata discovery forced on, as Istio does for waypoints)',
    args: ['proxy', 'waypoint', '--domain', 'shop.svc.cluster.local', '--proxyLogLevel=warning'],
    env: { POD_NAME: 'waypoint-5d8c7-qwert', POD_NAMESPACE: 'shop', INSTANCE_IP: '10.44.0.21', SERVICE_ACCOUNT: 'waypoint', ISTIO_DELTA_XDS: 'false', ISTIO_META_ENABLE_HBONE: 'true' },
    files: { 'etc/istio/pod/labels': downward({ 'gateway.networking.k8s.io/gateway-name': 'waypoint', 'istio.io/dataplane-mode': 'none' }) },
    ipv4: '10.44.0.21',
  },
  {
    name: 'remote-services',
    what: 'a sidecar sending metrics to a metrics service (Istio mTLS) and statsd, an access log service (mutual TLS), mTLS scrape ports',
    args: ['proxy', 'sidecar', ...INJECTED_FLAGS],
    env: {
      ...POD_ENV, INSTANCE_IP: '10.44.0.7', ENVOY_SECURE_METRICS_PORT: '15091', ENVOY_SECURE_MERGED_METRICS_PORT: '15092',
      PROXY_CONFIG: JSON.stringify({
        envoyMetricsService: { address: 'metrics.monitoring:15000', tcpKeepalive: { probes: 3, time: '10s', interval: '5s' }, tlsSettings: { mode: 'ISTIO_MUTUAL' } },
        envoyAccessLogService: { address: 'als.monitoring:9000', tlsSettings: { mode: 'MUTUAL', clientCertificate: '/etc/als/cert.pem', privateKey: '/etc/als/key.pem', caCertificates: '/etc/als/ca.pem', subjectAltNames: ['als.monitoring'] } },
        statsdUdpAddress: '10.0.0.9:8125',
        tracing: { datadog: { address: '$(HOST_IP):8126' } },
      }),
    },
    ipv4: '10.44.0.7',
  },
  {
    name: 'dual-stack',
    what: 'a dual-stack sidecar with ISTIO_DUAL_STACK (IPv6 first), metrics on localhost only, zipkin over TLS',
    args: ['proxy', 'sidecar', ...INJECTED_FLAGS],
    env: {
      ...POD_ENV, INSTANCE_IP: 'fd00:10:44::8', ISTIO_DUAL_STACK: 'true',
      PROXY_CONFIG: JSON.stringify({
        proxyMetadata: { METRICS_LOCALHOST_ACCESS_ONLY: 'true' },
        tracing: { zipkin: { address: 'zipkin.istio-system:9411' }, tlsSettings: { mode: 'SIMPLE', caCertificates: '/etc/zipkin/ca.pem', sni: 'zipkin.example' } },
      }),
    },
    ipv4: '10.44.0.8',
    ipv6: 'fd00:10:44::8',
  },
  {
    name: 'image-template',
    what: 'a customised template at Istio\'s default path in the image (./var/lib/istio/envoy/envoy_bootstrap_tmpl.json)',
    args: ['proxy', 'router', '--domain', 'istio-system.svc.cluster.local'],
    env: { POD_NAME: 'gw-1', POD_NAMESPACE: 'istio-system', INSTANCE_IP: '10.44.0.12', ISTIO_META_WORKLOAD_NAME: 'gw' },
    imageTemplate: CUSTOM_TEMPLATE,
    ipv4: '10.44.0.12',
  },
  {
    name: 'custom-template',
    what: 'a user template in Go text/template (--templateFile) using if/else, range, with, variables, pipelines and functions',
    args: ['proxy', 'sidecar', ...INJECTED_FLAGS, '--templateFile', './custom-template.json'],
    env: {
      ...POD_ENV, INSTANCE_IP: '10.44.0.7', ISTIO_META_WORKLOAD_NAME: 'web',
      PROXY_CONFIG: JSON.stringify({ extraStatTags: ['request_host'], tracing: { zipkin: { address: 'zipkin.istio-system:9411' } } }),
    },
    files: { 'etc/istio/pod/labels': downward({ app: 'web', version: 'v1' }) },
    ipv4: '10.44.0.7',
  },
];

// ---- running one agent on one set ----

export interface AgentRun {
  bootstrap: Json;
  /** Envoy's command line, without the program name. */
  envoyArgs: string[];
}

/**
 * Runs `command` (the agent) on one input set in its own network, mount and PID namespace: a veth "eth0" with the
 * set's addresses, the fake Envoy at the default binaryPath /usr/local/bin/envoy (a tmpfs there), and a fresh
 * working directory. Returns once the fake Envoy has copied its bootstrap; everything started is gone then.
 */
export async function runAgent(command: string[], set: InputSet, opts: { goAgent?: boolean } = {}, timeoutMs = 90_000): Promise<AgentRun> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `parity-${set.name}-`));
  try {
    for (const [rel, text] of Object.entries(set.files ?? {})) {
      fs.mkdirSync(path.dirname(path.join(dir, rel)), { recursive: true });
      fs.writeFileSync(path.join(dir, rel), text);
    }
    // The Go agent always renders a template: Istio's stock one (through ISTIO_BOOTSTRAP, so that this agent,
    // finding nothing at the default path, generates its bootstrap) unless the set names or places its own.
    const extraEnv: Record<string, string> = {};
    fs.copyFileSync(ISTIO_TEMPLATE, path.join(dir, 'istio-stock-template.json'));
    fs.copyFileSync(CUSTOM_TEMPLATE, path.join(dir, 'custom-template.json'));
    if (set.imageTemplate) {
      fs.mkdirSync(path.join(dir, 'var/lib/istio/envoy'), { recursive: true });
      fs.copyFileSync(set.imageTemplate, path.join(dir, 'var/lib/istio/envoy/envoy_bootstrap_tmpl.json'));
    } else if (opts.goAgent && !set.args.includes('--templateFile')) {
      extraEnv.ISTIO_BOOTSTRAP = './istio-stock-template.json';
    }
    // A root certificate, so that the Go agent gets as far as starting Envoy.
    fs.mkdirSync(path.join(dir, 'var/run/secrets/istio'), { recursive: true });
    fs.copyFileSync(path.join(REPO, 'test', 'fixtures', 'parity', 'root-cert.pem'), path.join(dir, 'var/run/secrets/istio/root-cert.pem'));

    const setup = [
      'set -e',
      'ip link set lo up',
      ...(set.ipv4 || set.ipv6 ? ['ip link add eth0 type veth peer name veth-peer', 'ip link set veth-peer up', 'ip link set eth0 up'] : []),
      ...(set.ipv4 ? [`ip addr add ${set.ipv4}/24 dev eth0`] : []),
      ...(set.ipv6 ? [`ip addr add ${set.ipv6}/64 dev eth0 nodad`] : []),
      'mount -t tmpfs tmpfs /usr/local/bin',
      `cp ${FAKE_ENVOY} /usr/local/bin/envoy`,
      'exec "$@"',
    ].join('\n');
    const env = { PATH: '/usr/local/bin:/usr/bin:/bin', ...set.env, ...extraEnv };
    const argv = ['-n', '-m', '-p', '-f', '--kill-child', 'sh', '-c', setup, 'sh', 'env', '-i', ...Object.entries(env).map(([k, v]) => `${k}=${v}`), ...command, ...set.args];
    const child = spawn('unshare', argv, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
    let log = '';
    child.stdout.on('data', (c: Buffer) => (log += c.toString()));
    child.stderr.on('data', (c: Buffer) => (log += c.toString()));
    const exited = new Promise<void>((r) => child.once('close', () => r()));
    const out = path.join(dir, 'parity-envoy.json');
    const deadline = Date.now() + timeoutMs;
    try {
      while (!fs.existsSync(out)) {
        if (child.exitCode !== null || Date.now() > deadline) {
          throw new Error(`${set.name}: ${command.join(' ')} wrote no bootstrap (${child.exitCode !== null ? `exit ${child.exitCode}` : 'timed out'}):\n${log.slice(-3000)}`);
        }
        await new Promise((r) => setTimeout(r, 100));
      }
    } finally {
      // --kill-child: the namespace's init dies with unshare, and every process in the namespace with it.
      child.kill('SIGKILL');
      await exited;
    }
    const bootstrap = JSON.parse(fs.readFileSync(out, 'utf8')) as Json;
    const envoyArgs = fs.readFileSync(path.join(dir, 'parity-envoy.args'), 'utf8').split('\n').filter((l) => l !== '');
    return { bootstrap, envoyArgs };
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

// ---- semantic diff ----

/**
 * Rewrites forms Envoy treats as the same config into one form: a udpa TypedStruct into the typed message it
 * carries, the deprecated Cluster.max_requests_per_connection into the HTTP protocol options, and a protobuf
 * wrapper written as an object (`{"value": 3}`, Go's JSON of a UInt32Value) into the bare value, and a field's
lowerCamel JSON name into its proto name.
 */
export function normalise(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(normalise);
  if (v === null || typeof v !== 'object') return v;
  const keys = Object.keys(v);
  if (keys.length === 1 && keys[0] === 'value' && ['number', 'boolean'].includes(typeof (v as Json).value)) return (v as Json).value;
  let o = v as Json;
  if (o['@type'] === 'type.googleapis.com/udpa.type.v1.TypedStruct' && typeof o.type_url === 'string') {
    o = { '@type': o.type_url, ...(o.value as Json) };
  }
  const out: Json = {};
  // Proto JSON takes a field by its lowerCamel name too; Istio's template writes one field so.
  for (const [k, x] of Object.entries(o)) out[k === 'additionalAddresses' ? 'additional_addresses' : k] = normalise(x);
  const opts = 'envoy.extensions.upstreams.http.v3.HttpProtocolOptions';
  if (typeof out.max_requests_per_connection === 'number' && out.typed_extension_protocol_options) {
    const p = (out.typed_extension_protocol_options as Json)[opts] as Json | undefined;
    if (p) {
      p.common_http_protocol_options = { ...(p.common_http_protocol_options as Json), max_requests_per_connection: out.max_requests_per_connection };
      delete out.max_requests_per_connection;
    }
  }
  return out;
}

export interface Difference {
  path: string;
  kind: 'changed' | 'only-go' | 'only-ours';
  go?: unknown;
  ours?: unknown;
}

const listKey = (x: unknown, i: number) =>
  x !== null && typeof x === 'object' && typeof (x as Json).name === 'string' ? `name=${(x as Json).name}` : String(i);

/** Differences between two JSON values, ignoring key order; list items with a `name` are matched by name. */
export function jsonDiff(go: unknown, ours: unknown, at = ''): Difference[] {
  const out: Difference[] = [];
  const isObj = (v: unknown): v is Json => v !== null && typeof v === 'object' && !Array.isArray(v);
  if (isObj(go) && isObj(ours)) {
    for (const k of new Set([...Object.keys(go), ...Object.keys(ours)])) {
      const p = at ? `${at}.${k}` : k;
      if (!(k in ours)) out.push({ path: p, kind: 'only-go', go: go[k] });
      else if (!(k in go)) out.push({ path: p, kind: 'only-ours', ours: ours[k] });
      else out.push(...jsonDiff(go[k], ours[k], p));
    }
  } else if (Array.isArray(go) && Array.isArray(ours)) {
    const a = new Map(go.map((x, i) => [listKey(x, i), x]));
    const b = new Map(ours.map((x, i) => [listKey(x, i), x]));
    for (const k of new Set([...a.keys(), ...b.keys()])) {
      const p = `${at}[${k}]`;
      if (!b.has(k)) out.push({ path: p, kind: 'only-go', go: a.get(k) });
      else if (!a.has(k)) out.push({ path: p, kind: 'only-ours', ours: b.get(k) });
      else out.push(...jsonDiff(a.get(k), b.get(k), p));
    }
  } else if (JSON.stringify(go) !== JSON.stringify(ours)) {
    out.push({ path: at, kind: 'changed', go, ours });
  }
  return out;
}

/** Envoy's flags as `flag -> value` ("" for a flag without a value). */
export function argMap(args: string[]): Json {
  const m: Json = {};
  for (let i = 0; i < args.length; i++) {
    const a = args[i]!;
    if (!a.startsWith('-')) continue;
    const next = args[i + 1];
    m[a] = next !== undefined && !next.startsWith('-') ? (i++, next) : '';
  }
  return m;
}

/** Bootstrap and command-line differences of one run against the Go agent's. */
export function compareRuns(go: AgentRun, ours: AgentRun): Difference[] {
  return [
    ...jsonDiff(normalise(go.bootstrap), normalise(ours.bootstrap)),
    ...jsonDiff(argMap(go.envoyArgs), argMap(ours.envoyArgs), 'args'),
  ];
}

// ---- allow-list ----

export interface Allowed {
  /** Input set names, or "*". */
  sets: string[] | '*';
  /** The difference's path; `*` matches any run of characters. */
  path: string;
  kind?: Difference['kind'];
  why: string;
}

export function loadAllowList(): Allowed[] {
  return JSON.parse(fs.readFileSync(ALLOW_FILE, 'utf8')) as Allowed[];
}

const globRe = (g: string) => new RegExp(`^${g.split('*').map((s) => s.replace(/[.+?^${}()|[\]\\]/g, '\\$&')).join('.*')}$`);

export function allowedBy(list: Allowed[], set: string, d: Difference): Allowed | undefined {
  return list.find((a) => (a.sets === '*' || a.sets.includes(set)) && (!a.kind || a.kind === d.kind) && globRe(a.path).test(d.path));
}

export function formatDifference(d: Difference): string {
  const show = (v: unknown) => {
    const s = JSON.stringify(v);
    return s.length > 160 ? `${s.slice(0, 157)}...` : s;
  };
  if (d.kind === 'changed') return `~ ${d.path}: go ${show(d.go)} -> ours ${show(d.ours)}`;
  if (d.kind === 'only-go') return `- ${d.path}: ${show(d.go)} (only Go)`;
  return `+ ${d.path}: ${show(d.ours)} (only ours)`;
}

// ---- goldens ----

export const goldenFile = (set: string) => path.join(GOLDEN_DIR, `${set}.json`);

export function readGolden(set: string): AgentRun {
  return JSON.parse(fs.readFileSync(goldenFile(set), 'utf8')) as AgentRun;
}

/**
 * This agent's command: the TypeScript source run through tsx's loader, so the check always sees the current
 * code. (Not tsx's CLI: it listens on /tmp/tsx-<uid>/<pid>.pipe, and every run here is pid 1 of its namespace.)
 */
export function ourAgentCommand(): string[] {
  const loader = pathToFileURL(path.join(REPO, 'node_modules', 'tsx', 'dist', 'loader.mjs')).href;
  return [process.execPath, '--import', loader, path.join(REPO, 'agent.ts')];
}

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { buildConfig, type Flags } from '../lib/config';
import { buildNodeIdentity, chooseIps, isIpv6Only, type HostAddress } from '../lib/node-identity';

const v4 = (address: string, internal = false): HostAddress => ({ address, family: 'IPv4', internal });
const v6 = (address: string, internal = false): HostAddress => ({ address, family: 'IPv6', internal });
const HOSTS = [v4('127.0.0.1', true), v6('::1', true), v4('10.0.0.5'), v6('fe80::1'), v6('fd00::5')];

function identity(opts: { env?: Record<string, string>; flags?: Flags; files?: Record<string, string>; hosts?: HostAddress[] } = {}) {
  const env = { POD_NAME: 'web-1', POD_NAMESPACE: 'shop', ...opts.env };
  const cfg = buildConfig({ flags: opts.flags ?? {}, env, readFile: (f) => opts.files?.[f] });
  return buildNodeIdentity(cfg, env, opts.hosts ?? HOSTS, '1.2.3');
}

test('id is type~ip~POD_NAME.POD_NAMESPACE~POD_NAMESPACE.svc.cluster.local', () => {
  assert.is(identity({ env: { INSTANCE_IP: '10.1.2.3' } }).id, 'sidecar~10.1.2.3~web-1.shop~shop.svc.cluster.local');
  assert.is(identity({ env: { INSTANCE_IP: '10.1.2.3' }, flags: { proxyType: 'router' } }).id, 'router~10.1.2.3~web-1.shop~shop.svc.cluster.local');
  assert.ok(identity({ flags: { proxyType: 'ingress' } }).id.startsWith('router~'), 'ingress runs as a router');
});

test('INSTANCE_IP comes first, then the host\'s non-loopback, non-link-local addresses', () => {
  const n = identity({ env: { INSTANCE_IP: '10.1.2.3' } });
  assert.equal(n.ips, ['10.1.2.3', '10.0.0.5', 'fd00::5']);
  assert.is(n.metadata.INSTANCE_IPS, '10.1.2.3,10.0.0.5,fd00::5');
  assert.equal(chooseIps(['10.0.0.5'], HOSTS), ['10.0.0.5', 'fd00::5'], 'no duplicates');
});

test('without INSTANCE_IP the first host address is used; loopback only as a last resort', () => {
  assert.is(identity().id, 'sidecar~10.0.0.5~web-1.shop~shop.svc.cluster.local');
  assert.equal(chooseIps([], [v4('127.0.0.1', true)]), ['127.0.0.1', '::1'], 'no non-loopback address: both loopbacks, as Istio');
  assert.equal(chooseIps([], [v6('::1', true)]), ['127.0.0.1', '::1']);
  assert.equal(chooseIps([], []), ['127.0.0.1', '::1']);
  assert.equal(chooseIps(['10.1.2.3'], []), ['10.1.2.3', '127.0.0.1', '::1']);
});

test('IPv6-only pods are detected; dual-stack pods are not', () => {
  const n = identity({ env: { INSTANCE_IP: 'fd00::7' }, hosts: [v6('::1', true), v6('fd00::7')] });
  assert.is(n.ipv6, true);
  assert.is(n.id, 'sidecar~fd00::7~web-1.shop~shop.svc.cluster.local');
  assert.is(identity({ env: { INSTANCE_IP: '10.1.2.3' } }).ipv6, false);
  assert.is(isIpv6Only(['fd00::1', '10.0.0.1']), false);
});

test('a malformed INSTANCE_IP is refused naming the variable', () => {
  assert.throws(() => identity({ env: { INSTANCE_IP: '10.1.2' } }), /INSTANCE_IP/);
});

test('ISTIO_META_* become string metadata; ProxyConfig.proxyMetadata counts too, env wins', () => {
  const n = identity({ env: { ISTIO_META_FOO: 'bar', ISTIO_META_NUM: '12', ISTIO_META_SHARED: 'from-env', PROXY_CONFIG: '{"proxyMetadata": {"ISTIO_META_FROM_PC": "pc", "ISTIO_META_SHARED": "from-pc"}}' } });
  assert.is(n.metadata.FOO, 'bar');
  assert.is(n.metadata.NUM, '12');
  assert.is(n.metadata.FROM_PC, 'pc');
  assert.is(n.metadata.SHARED, 'from-env');
});

test('ISTIO_METAJSON_* values are parsed as JSON', () => {
  const n = identity({ env: { ISTIO_METAJSON_LABELS: '{"app": "web", "tier": "front"}' } });
  assert.equal(n.metadata.LABELS, { app: 'web', tier: 'front' });
});

test('ISTIO_METAJSON_* objects merge into the top level, over ISTIO_META_* strings (as Istio)', () => {
  const n = identity({ env: { ISTIO_META_MODE: 'plain', ISTIO_METAJSON_EXTRA: '{"MODE": "json", "PORTS": [1, 2], "NESTED": {"a": true}}' } });
  assert.is(n.metadata.MODE, 'json');
  assert.equal(n.metadata.PORTS, [1, 2]);
  assert.equal(n.metadata.NESTED, { a: true });
  assert.not.ok('EXTRA' in n.metadata, 'the variable name itself is ignored');
});

test('pod labels file wins over ISTIO_METAJSON_LABELS; pod-template-hash is dropped', () => {
  const n = identity({
    env: { ISTIO_METAJSON_LABELS: '{"app": "old", "team": "a"}' },
    files: { './etc/istio/pod/labels': 'app="web"\npod-template-hash="abc123"\n' },
  });
  assert.equal(n.metadata.LABELS, { app: 'web', team: 'a' });
});

test('bad ISTIO_METAJSON_* JSON names the variable', () => {
  try {
    identity({ env: { ISTIO_METAJSON_LABELS: '{app: web' } });
    assert.unreachable('expected an error');
  } catch (e) {
    assert.match((e as Error).message, /ISTIO_METAJSON_LABELS/);
    assert.match((e as Error).message, /not valid JSON/);
    assert.is((e as { code?: string }).code, 'CONFIG_INVALID');
  }
});

test('pod labels and annotations files land in LABELS and ANNOTATIONS', () => {
  const n = identity({
    files: {
      './etc/istio/pod/labels': 'app="web"\nversion="v1"\n',
      './etc/istio/pod/annotations': 'sidecar.istio.io/inject="true"\nprometheus.io/path="/metrics"\n',
    },
  });
  assert.equal(n.metadata.LABELS, { app: 'web', version: 'v1' });
  assert.equal(n.metadata.ANNOTATIONS, { 'sidecar.istio.io/inject': 'true', 'prometheus.io/path': '/metrics' });
  assert.not.ok('LABELS' in identity().metadata, 'no labels file, no LABELS');
});

test('standard metadata: namespace, name, version, ports, cluster id, service account', () => {
  const n = identity({ env: { SERVICE_ACCOUNT: 'web-sa', ENVOY_STATUS_PORT: '16021' } });
  assert.is(n.metadata.NAMESPACE, 'shop');
  assert.is(n.metadata.NAME, 'web-1');
  assert.is(n.metadata.ISTIO_VERSION, '1.2.3');
  assert.is(n.metadata.ENVOY_STATUS_PORT, 16021);
  assert.is(n.metadata.ENVOY_PROMETHEUS_PORT, 15090);
  assert.is(n.metadata.CLUSTER_ID, undefined, 'only ISTIO_META_CLUSTER_ID itself puts it there');
  assert.is(identity({ env: { ISTIO_META_CLUSTER_ID: 'east' } }).metadata.CLUSTER_ID, 'east');
  assert.equal(n.metadata.PILOT_SAN, ['istiod.istio-system.svc']);
  assert.is(n.metadata.METADATA_DISCOVERY, 'false');
  assert.is(n.metadata.ENVOY_SKIP_DEPRECATED_LOGS, 'true');
  assert.is(n.metadata.WORKLOAD_IDENTITY_SOCKET_FILE, 'socket');
  assert.is(n.metadata.SERVICE_ACCOUNT, 'web-sa');
  assert.is(identity({ env: { ISTIO_VERSION: '1.99.0' } }).metadata.ISTIO_VERSION, '1.99.0');
});

test('cluster: <app label>.<ns>, else <WORKLOAD_NAME>.<ns>, else istio-proxy.<ns>, unless serviceCluster is set', () => {
  assert.is(identity().cluster, 'istio-proxy.shop');
  assert.is(identity({ env: { ISTIO_META_WORKLOAD_NAME: 'web-v1' } }).cluster, 'web-v1.shop');
  assert.is(identity({ env: { ISTIO_META_WORKLOAD_NAME: 'web-v1' }, files: { './etc/istio/pod/labels': 'app="web"\n' } }).cluster, 'web.shop');
  assert.is(identity({ env: { PROXY_CONFIG: '{"serviceCluster": "mine"}' } }).cluster, 'mine');
  const canonical = { './etc/istio/pod/labels': 'app="web"\nservice.istio.io/canonical-name="shopfront"\n' };
  assert.is(identity({ env: { PROXY_CONFIG: '{"tracingServiceName": "CANONICAL_NAME_AND_NAMESPACE"}' }, files: canonical }).cluster, 'shopfront.shop');
});

test('cluster is the service cluster; locality from ISTIO_META_LOCALITY', () => {
  const n = identity({ flags: { serviceCluster: 'web.shop' }, env: { ISTIO_META_LOCALITY: 'us-east1/us-east1-b/rack7' } });
  assert.is(n.cluster, 'web.shop');
  assert.equal(n.locality, { region: 'us-east1', zone: 'us-east1-b', sub_zone: 'rack7' });
  assert.equal(identity().locality, {});
});

test('DNS proxy address is in metadata only when DNS_PROXY_ADDR is set, as Istio', () => {
  assert.is(identity({ env: { ISTIO_META_DNS_CAPTURE: 'true' } }).metadata.DNS_PROXY_ADDR, undefined);
  assert.is(identity({ env: { DNS_PROXY_ADDR: '127.0.0.1:15053' } }).metadata.DNS_PROXY_ADDR, '127.0.0.1:15053');
});

test('PROXY_CONFIG metadata is the effective ProxyConfig in Istio\'s JSON form, including fields only istiod reads', () => {
  const pc = {
    concurrency: 2, tracing: { sampling: 10, zipkin: { address: 'zipkin:9411' } }, drainDuration: '1m', terminationDrainDuration: '2500ms',
    gatewayTopology: { numTrustedProxies: 2, forwardClientCertDetails: 'SANITIZE_SET' }, proxyHeaders: { server: { disabled: true } },
    privateKeyProvider: { cryptomb: { pollDelay: '0.01s' } },
  };
  const meta = identity({ env: { PROXY_CONFIG: JSON.stringify(pc) } }).metadata.PROXY_CONFIG as Record<string, unknown>;
  assert.equal(meta, {
    configPath: './etc/istio/proxy', binaryPath: '/usr/local/bin/envoy', serviceCluster: 'istio-proxy', drainDuration: '60s',
    terminationDrainDuration: '2.500s', discoveryAddress: 'istiod.istio-system.svc:15012', proxyAdminPort: 15000, statusPort: 15020,
    controlPlaneAuthPolicy: 'MUTUAL_TLS', concurrency: 2, statNameLength: 189, tracing: pc.tracing,
    gatewayTopology: pc.gatewayTopology, proxyHeaders: pc.proxyHeaders, privateKeyProvider: pc.privateKeyProvider,
  });
});

test('metadata is plain JSON (Struct-compatible): it survives a JSON round trip', () => {
  const n = identity({ env: { ISTIO_METAJSON_LABELS: '{"a": "b"}', ISTIO_META_X: 'y' } });
  assert.equal(JSON.parse(JSON.stringify(n.metadata)), n.metadata);
});


test('without ISTIO_VERSION the agent reports the Istio version it implements (1.32-dev), not its package version', async () => {
  const { resolveAll } = await import('../lib/resolve');
  const { ISTIO_VERSION_IMPLEMENTED } = await import('../lib/istio-version');
  const { VERSION } = await import('../lib/version');
  const env = { POD_NAME: 'vm-1', POD_NAMESPACE: 'test', INSTANCE_IP: '10.0.0.5' };
  assert.is(ISTIO_VERSION_IMPLEMENTED, '1.32-dev');
  assert.is.not(VERSION, ISTIO_VERSION_IMPLEMENTED);
  assert.is(resolveAll({}, env).node.metadata.ISTIO_VERSION, '1.32-dev');
  assert.is(resolveAll({}, { ...env, ISTIO_VERSION: '1.27.3' }).node.metadata.ISTIO_VERSION, '1.27.3');
});

test.run();

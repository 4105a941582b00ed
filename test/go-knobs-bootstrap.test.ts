// ISTIO_BOOTSTRAP_OVERRIDE with `$(HOST_IP)` (node-local tracing agents, e.g. Datadog's at $(HOST_IP):8126): the
// placeholder is replaced in the file's text as Istio's readBootstrapToJSON (pkg/envoy/proxy.go) does it, IPv6
// bracketed, `[$(HOST_IP)]` not bracketed twice, and the real Envoy accepts the result; left as written, Envoy
// refuses "$(HOST_IP)" as an address.

import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { renderBootstrap } from '../lib/bootstrap';
import { expandHostIp, resolveBootstrap } from '../lib/bootstrap-loader';
import { buildConfig } from '../lib/config';
import { envoyArgs } from '../lib/envoy-args';
import { buildNodeIdentity, type HostAddress } from '../lib/node-identity';
import { envoyBin, tempDir } from './helpers/harness';

test('$(HOST_IP) is replaced as Go replaces it', () => {
  assert.is(expandHostIp('a: $(HOST_IP):8126 b: [$(HOST_IP)]:1', '10.1.2.3'), 'a: 10.1.2.3:8126 b: [10.1.2.3]:1');
  assert.is(expandHostIp('a: $(HOST_IP):8126 b: [$(HOST_IP)]:1', 'fd00::1'), 'a: [fd00::1]:8126 b: [fd00::1]:1');
  assert.is(expandHostIp('a: "$(HOST_IP)"', ''), 'a: ""');
  assert.is(expandHostIp('a: $(HOST_IP)', '$&x'), 'a: $&x', 'a $ in HOST_IP is not a replacement pattern');
});

const OVERRIDE = `
static_resources:
  clusters:
  - name: datadog_agent
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: datadog_agent
      endpoints:
      - lb_endpoints:
        - endpoint: { address: { socket_address: { address: "$(HOST_IP)", port_value: 8126 } } }
`;

function clusterAddress(bootstrap: Record<string, unknown>): unknown {
  const clusters = (bootstrap.static_resources as { clusters: { name: string; load_assignment: any }[] }).clusters;
  return clusters.find((c) => c.name === 'datadog_agent')!.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.address;
}

const HOSTS: HostAddress[] = [{ address: '127.0.0.1', family: 'IPv4', internal: true }, { address: '10.44.0.7', family: 'IPv4', internal: false }];

test('the override\'s $(HOST_IP) becomes HOST_IP in the bootstrap, and the real Envoy accepts it', () => {
  const dir = tempDir('pa-knobs-override-');
  try {
    const files: Record<string, string> = { '/cfg/override.yaml': OVERRIDE };
    const env = { POD_NAME: 'web-1', POD_NAMESPACE: 'shop', INSTANCE_IP: '10.44.0.7', HOST_IP: '10.44.0.1', ISTIO_BOOTSTRAP_OVERRIDE: '/cfg/override.yaml' };
    const cfg = buildConfig({ flags: {}, env, readFile: (f) => files[f] });
    const { bootstrap } = resolveBootstrap(cfg, buildNodeIdentity(cfg, env, HOSTS, '1.0.0-test'), (f) => files[f]);
    assert.is(clusterAddress(bootstrap), '10.44.0.1');
    const file = path.join(dir.path, 'envoy-rev0.json');
    fs.writeFileSync(file, renderBootstrap(bootstrap));
    const args = envoyArgs({ cfg, configFile: file, epoch: 0, baseId: { dynamic: true, path: path.join(dir.path, 'base-id') }, ipv6: false });
    const r = spawnSync(envoyBin(), [...args, '--mode', 'validate'], { encoding: 'utf8', timeout: 60_000 });
    assert.is(r.status, 0, `${r.stdout}\n${r.stderr}`.split('\n').filter((l) => /error|invalid/i.test(l)).join('\n'));
  } finally {
    dir.cleanup();
  }
});

test('without HOST_IP the override is unusable either way, as in Go: the placeholder becomes empty', () => {
  const files: Record<string, string> = { '/cfg/override.yaml': OVERRIDE };
  const env = { POD_NAME: 'web-1', POD_NAMESPACE: 'shop', INSTANCE_IP: '10.44.0.7', ISTIO_BOOTSTRAP_OVERRIDE: '/cfg/override.yaml' };
  const cfg = buildConfig({ flags: {}, env, readFile: (f) => files[f] });
  const { bootstrap } = resolveBootstrap(cfg, buildNodeIdentity(cfg, env, HOSTS, '1.0.0-test'), (f) => files[f]);
  assert.is(clusterAddress(bootstrap), '');
});

test.run();

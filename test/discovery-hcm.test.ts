// Envoy accepts, and reports in its config dump, the HTTP connection manager settings and filters istiod sets
// (istio/istio 86c9f01f listener_builder.go buildHTTPConnectionManager), on a sidecar and on a router.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { destinationRule, gateway, serviceEntry, type Stack, startStack, virtualService } from './helpers/discovery-fixtures';
import { freePort, waitFor } from './helpers/harness';

let stack: Stack;
let gwPort = 0;

test.before(async () => {
  gwPort = await freePort();
  stack = await startStack(['v1'], ({ servicePort, backends }) => ({
    'service.yaml': serviceEntry(servicePort, [{ port: backends.v1!.port, version: 'v1' }]),
    'routing.yaml': `${destinationRule(['v1'])}---\n${virtualService({ v1: 100 }, '', ['mesh', 'ingress'])}---\n${gateway(gwPort)}`,
  }));
});

test.after(async () => {
  await stack?.stop();
});

interface Dumped {
  listener: { name: string; traffic_direction?: string; filter_chains: { filters: { typed_config: Record<string, unknown> }[] }[] };
}

async function listeners(kind: 'sidecar' | 'router'): Promise<Dumped['listener'][]> {
  const e = await stack.addEnvoy(kind, false);
  return waitFor(`${kind} listeners in the config dump`, async () => {
    const dump = await e.configDump();
    const l = (dump.configs as { '@type': string; dynamic_listeners?: { active_state?: Dumped }[] }[])
      .find((c) => c['@type'].endsWith('ListenersConfigDump'))?.dynamic_listeners?.map((d) => d.active_state?.listener).filter(Boolean) as Dumped['listener'][] | undefined;
    return l?.length ? l : undefined;
  });
}

function assertIstiodHcm(hcm: Record<string, unknown>, where: string): void {
  assert.equal(hcm.upgrade_configs, [{ upgrade_type: 'websocket' }], `${where}: websocket upgrades`);
  assert.is(hcm.stream_idle_timeout, '0s', `${where}: stream_idle_timeout`);
  assert.is(hcm.proxy_100_continue, true, `${where}: proxy_100_continue`);
  assert.is(hcm.path_with_escaped_slashes_action, 'KEEP_UNCHANGED', `${where}: escaped slashes`);
  assert.is(hcm.server_name, 'istio-envoy', `${where}: server_name`);
  assert.is(hcm.forward_client_cert_details, 'SANITIZE_SET', `${where}: XFCC`);
  assert.match(JSON.stringify(hcm.request_id_extension), /UuidRequestIdConfig/, `${where}: UUID request ids`);
  assert.equal((hcm.http_filters as { name: string }[]).map((f) => f.name),
    ['envoy.filters.http.grpc_stats', 'envoy.filters.http.fault', 'envoy.filters.http.cors', 'envoy.filters.http.router'], `${where}: filters`);
}

test('a sidecar HTTP listener has istiod\'s connection manager settings and filters', async () => {
  const ls = await listeners('sidecar');
  const l = ls.find((x) => x.name === `127.0.0.1_${stack.servicePort}`)!;
  assert.ok(l, 'the service port listener');
  assert.is(l.traffic_direction, 'OUTBOUND');
  assertIstiodHcm(l.filter_chains[0]!.filters[0]!.typed_config, 'sidecar');
});

test('a gateway listener is OUTBOUND, as istiod makes it, with the same settings', async () => {
  await stack.envoys.shift()!.stop();
  const ls = await listeners('router');
  const l = ls.find((x) => x.name === `127.0.0.1_${gwPort}`)!;
  assert.ok(l, 'the gateway port listener');
  assert.is(l.traffic_direction, 'OUTBOUND');
  assertIstiodHcm(l.filter_chains[0]!.filters[0]!.typed_config, 'router');
});

test.run();

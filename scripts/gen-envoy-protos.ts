// Regenerates proto/envoy.json: one protobufjs JSON descriptor with every Envoy message the agent encodes or
// decodes (xDS, the resources the embedded discovery server builds, SDS secrets). The .proto sources come
// from the dev dependency @grpc/grpc-js-xds (deps/); the generated file is committed, so builds need no network.
// Run: npx tsx scripts/gen-envoy-protos.ts

import * as fs from 'node:fs';
import * as path from 'node:path';
import * as protobuf from 'protobufjs';

const deps = path.join(path.dirname(require.resolve('@grpc/grpc-js-xds/package.json')), 'deps');
const includeDirs = ['envoy-api', 'xds', 'googleapis', 'protoc-gen-validate'].map((d) => path.join(deps, d));
const pbDir = path.dirname(require.resolve('protobufjs/package.json'));

const FILES = [
  'envoy/service/discovery/v3/ads.proto',
  'envoy/service/secret/v3/sds.proto',
  'envoy/config/cluster/v3/cluster.proto',
  'envoy/config/listener/v3/listener.proto',
  'envoy/config/route/v3/route.proto',
  'envoy/config/endpoint/v3/endpoint.proto',
  'envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto',
  'envoy/extensions/filters/network/tcp_proxy/v3/tcp_proxy.proto',
  'envoy/extensions/filters/network/direct_response/v3/config.proto',
  'envoy/extensions/filters/http/router/v3/router.proto',
  'envoy/extensions/transport_sockets/tls/v3/tls.proto',
  'envoy/extensions/transport_sockets/tls/v3/secret.proto',
  'envoy/extensions/transport_sockets/raw_buffer/v3/raw_buffer.proto',
  'envoy/extensions/filters/listener/tls_inspector/v3/tls_inspector.proto',
  'envoy/extensions/access_loggers/file/v3/file.proto',
  'envoy/extensions/upstreams/http/v3/http_protocol_options.proto',
  // HTTP filters and extensions istiod puts on every HTTP connection manager (discovery server)
  'envoy/extensions/filters/http/fault/v3/fault.proto',
  'envoy/extensions/filters/http/cors/v3/cors.proto',
  'envoy/extensions/filters/http/grpc_stats/v3/config.proto',
  'envoy/extensions/request_id/uuid/v3/uuid.proto',
  'envoy/extensions/retry/host/previous_hosts/v3/previous_hosts.proto',
  'envoy/extensions/retry/priority/previous_priorities/v3/previous_priorities_config.proto',
  // tracing providers istiod configures on the HTTP connection manager
  'envoy/config/trace/v3/zipkin.proto',
  // WasmPlugin: the Wasm filters the discovery server serves over ECDS (wraps envoy/extensions/wasm/v3)
  'envoy/extensions/filters/http/wasm/v3/wasm.proto',
  'envoy/extensions/filters/network/wasm/v3/wasm.proto',
];

const root = new protobuf.Root();
root.resolvePath = (origin, target) => {
  if (target.startsWith('google/protobuf/')) {
    const p = path.join(pbDir, target);
    if (fs.existsSync(p)) return p;
  }
  for (const dir of includeDirs) {
    const p = path.join(dir, target);
    if (fs.existsSync(p)) return p;
  }
  return protobuf.util.path.resolve(origin, target);
};
root.loadSync(FILES, { keepCase: true });
// The vendored Envoy API predates PluginConfig.failure_policy (field 7, Envoy 1.35), which istiod sets for a
// WasmPlugin's failStrategy; added here as Envoy declares it.
const wasmNs = root.lookup('envoy.extensions.wasm.v3') as protobuf.Namespace;
if (!wasmNs.get('FailurePolicy')) {
  wasmNs.add(new protobuf.Enum('FailurePolicy', { UNSPECIFIED: 0, FAIL_RELOAD: 1, FAIL_CLOSED: 2, FAIL_OPEN: 3 }));
  (wasmNs.get('PluginConfig') as protobuf.Type).add(new protobuf.Field('failure_policy', 7, 'FailurePolicy'));
}
// Nor TlsParameters.compliance_policies (field 6, Envoy 1.32), which istiod sets under COMPLIANCE_POLICY=fips-140-3.
const tlsParams = root.lookupType('envoy.extensions.transport_sockets.tls.v3.TlsParameters');
if (!tlsParams.get('compliance_policies')) {
  tlsParams.add(new protobuf.Enum('CompliancePolicy', { FIPS_202205: 0 }));
  tlsParams.add(new protobuf.Field('compliance_policies', 6, 'CompliancePolicy', 'repeated'));
}
root.resolveAll();
const out = path.resolve(__dirname, '..', 'proto', 'envoy.json');
fs.writeFileSync(out, JSON.stringify(root.toJSON()));
console.log(`wrote ${out} (${fs.statSync(out).size} bytes)`);

// The gRPC xDS bootstrap, pinned against Istio's format. The expected text is written from the facts of
// istio/istio pkg/istio-agent/grpcxds/grpc_bootstrap.go at commit 86c9f01fd735fb01d8192f5bcaf0d424afb7f14c
// (GenerateBootstrap + GenerateBootstrapFile: json.MarshalIndent of Bootstrap{xds_servers, node, certificate_providers,
// server_listener_resource_name_template}, the node being go-control-plane's core.Node through encoding/json, so
// `locality` is always there and `UserAgentVersionType` is null; metadata a Go map, so its keys sorted; refresh 15m
// as protojson "900s"; key/cert/root file names from OutputKeyCertToDir) and pkg/istio-agent/agent.go
// generateGRPCBootstrap (node.Metadata.Generator = "grpc").

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { validateBootstrapConfig } from '@grpc/grpc-js-xds/build/src/xds-bootstrap';
import { fileWatcherFiles, grpcBootstrap, renderGrpcBootstrap } from '../lib/grpc-bootstrap';

const INPUT = {
  nodeId: 'sidecar~10.44.0.7~echo-v1-abc.echo-grpc~echo-grpc.svc.cluster.local',
  metadata: { NAMESPACE: 'echo-grpc', LABELS: { version: 'v1', app: 'echo' }, CLUSTER_ID: 'Kubernetes', ANNOTATIONS: { 'a&b': '<x>' }, ISTIO_VERSION: '1.24.0' },
  locality: {},
  xdsSocket: './etc/istio/proxy/XDS',
  cwd: '/',
};

const GOLDEN_WITH_CERTS = `{
  "xds_servers": [
    {
      "server_uri": "unix:///etc/istio/proxy/XDS",
      "channel_creds": [
        {
          "type": "insecure"
        }
      ],
      "server_features": [
        "xds_v3"
      ]
    }
  ],
  "node": {
    "id": "sidecar~10.44.0.7~echo-v1-abc.echo-grpc~echo-grpc.svc.cluster.local",
    "metadata": {
      "ANNOTATIONS": {
        "a\\u0026b": "\\u003cx\\u003e"
      },
      "CLUSTER_ID": "Kubernetes",
      "GENERATOR": "grpc",
      "ISTIO_VERSION": "1.24.0",
      "LABELS": {
        "app": "echo",
        "version": "v1"
      },
      "NAMESPACE": "echo-grpc"
    },
    "locality": {},
    "UserAgentVersionType": null
  },
  "certificate_providers": {
    "default": {
      "plugin_name": "file_watcher",
      "config": {
        "certificate_file": "/var/lib/istio/data/cert-chain.pem",
        "private_key_file": "/var/lib/istio/data/key.pem",
        "ca_certificate_file": "/var/lib/istio/data/root-cert.pem",
        "refresh_interval": "900s"
      }
    }
  },
  "server_listener_resource_name_template": "xds.istio.io/grpc/lds/inbound/%s"
}`;

test('gRPC bootstrap is byte for byte what the Go agent writes (OUTPUT_CERTS set)', () => {
  assert.is(renderGrpcBootstrap({ ...INPUT, certDir: '/var/lib/istio/data' }), GOLDEN_WITH_CERTS);
});

test('without OUTPUT_CERTS there is no certificate provider, as in Go', () => {
  const b = grpcBootstrap(INPUT);
  assert.is(b.certificate_providers, undefined);
  assert.equal(Object.keys(b), ['xds_servers', 'node', 'server_listener_resource_name_template']);
  assert.is(fileWatcherFiles(b), undefined);
});

test('locality from the node is written; the socket path is made absolute', () => {
  const b = grpcBootstrap({ ...INPUT, locality: { region: 'eu', zone: 'eu-1', sub_zone: 'a' }, xdsSocket: 'cfg/XDS', cwd: '/work/x' }) as Record<string, any>;
  assert.equal(b.node.locality, { region: 'eu', zone: 'eu-1', sub_zone: 'a' });
  assert.is(b.xds_servers[0].server_uri, 'unix:///work/x/cfg/XDS');
});

test('grpc-js-xds accepts the bootstrap (node locality, server, certificate provider, listener template)', () => {
  const parsed = validateBootstrapConfig(JSON.parse(renderGrpcBootstrap({ ...INPUT, certDir: '/var/lib/istio/data' })));
  assert.is(parsed.node.id, INPUT.nodeId);
  assert.is(parsed.xdsServers[0]!.server_uri, 'unix:///etc/istio/proxy/XDS');
  assert.is(parsed.serverListenerResourceNameTemplate, 'xds.istio.io/grpc/lds/inbound/%s');
  assert.ok(parsed.certificateProviders.default);
});

test('the file_watcher files are what readiness waits for', () => {
  assert.equal(fileWatcherFiles(grpcBootstrap({ ...INPUT, certDir: 'out' })), ['out/cert-chain.pem', 'out/key.pem', 'out/root-cert.pem']);
});

test.run();

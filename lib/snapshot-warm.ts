// Work done once at build time inside the V8 startup snapshot (agent-snapshot.ts), so no start pays for it:
// protobufjs building Envoy's and Istio's message types from their JSON descriptors, and generating the
// encoders/decoders (and fromObject/toObject converters) of the types the agent and its discovery server use.
// The discovery generator runs over a small config covering every kind it reads, for a sidecar and a gateway,
// so exactly the types it encodes are warmed. Nothing here may open a socket, start a timer or read the env.

import { MemoryConfigStore } from './discovery/config-store';
import { generate } from './discovery/generate';
import { proxyFromNode } from './discovery/proxy';
import { PushContext } from './discovery/push-context';
import { ServiceEntryRegistry } from './discovery/registry';
import { PUSH_ORDER } from './discovery/resources';
import { parseConfigFile } from './discovery/yaml-file';
import { messageType } from './envoy-protos';
import { decodeNameTable, encodeNameTable, NAME_TABLE_TYPE } from './xds-istio';
import { AgentError } from './errors';

const WARM_CONFIG = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: warm}
spec:
  hosts: [web.warm.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP}, {number: 9090, name: tcp, protocol: TCP}]
  endpoints:
  - {address: 10.0.0.1, ports: {http: 8080, tcp: 9090}, labels: {version: v1}}
  - {address: 10.0.0.2, ports: {http: 8080, tcp: 9090}, labels: {version: v2}, weight: 2}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext, namespace: warm}
spec:
  hosts: [ext.example.com]
  resolution: DNS
  ports: [{number: 443, name: tcp, protocol: TCP}]
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: vm, namespace: warm}
spec: {address: 10.0.0.3, labels: {app: web}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: web, namespace: warm}
spec:
  host: web.warm.local
  trafficPolicy:
    loadBalancer: {simple: LEAST_REQUEST}
    connectionPool: {tcp: {maxConnections: 10, connectTimeout: 1s}, http: {http1MaxPendingRequests: 5, maxRequestsPerConnection: 2}}
    outlierDetection: {consecutive5xxErrors: 3, interval: 1s, baseEjectionTime: 30s}
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}, trafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: web, namespace: warm}
spec:
  hosts: [web.warm.local, web.example.com]
  gateways: [mesh, ingress]
  http:
  - match: [{uri: {prefix: /v2}, headers: {x-v: {exact: "2"}}}]
    route: [{destination: {host: web.warm.local, subset: v2}}]
    timeout: 2s
    retries: {attempts: 2, perTryTimeout: 1s, retryOn: 5xx}
  - match: [{uri: {prefix: /r/}}]
    rewrite: {uri: /v1/}
    route: [{destination: {host: web.warm.local}}]
  - route:
    - {destination: {host: web.warm.local, subset: v1, port: {number: 8080}}, weight: 90}
    - {destination: {host: web.warm.local, subset: v2}, weight: 10}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: warm}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["*"]
`;

const str = (s: string) => ({ stringValue: s });
const NODES = [
  {
    id: 'sidecar~10.0.0.1~web-1.warm~warm.svc.cluster.local',
    metadata: { fields: { LABELS: { structValue: { fields: { app: str('web') } } } } },
  },
  {
    id: 'router~10.0.0.9~gw-1.warm~warm.svc.cluster.local',
    metadata: { fields: { LABELS: { structValue: { fields: { istio: str('ingressgateway') } } } } },
  },
];

const ADS_TYPES = [
  'envoy.service.discovery.v3.DiscoveryRequest',
  'envoy.service.discovery.v3.DiscoveryResponse',
  'envoy.service.discovery.v3.DeltaDiscoveryRequest',
  'envoy.service.discovery.v3.DeltaDiscoveryResponse',
];

export function warmForSnapshot(): void {
  const { configs, issues } = parseConfigFile('snapshot-warm.yaml', WARM_CONFIG);
  if (issues.length)
    throw new AgentError('INTERNAL', `snapshot warm-up config: ${issues.map((i) => i.message).join('; ')}`);
  const store = new MemoryConfigStore();
  const registry = new ServiceEntryRegistry(store);
  registry.run();
  for (const c of configs) store.create(c);
  const push = PushContext.build('warm', store, registry);
  for (const node of NODES) {
    const proxy = proxyFromNode(node);
    for (const type of PUSH_ORDER) generate(push, proxy, type);
  }
  // The ADS server's request/response codecs, both ways, as the server runs them.
  for (const name of ADS_TYPES) {
    const t = messageType(name);
    const bytes = t
      .encode(t.fromObject({ type_url: 'x', node: { id: 'x', metadata: { fields: { a: str('b') } } }, resources: [] }))
      .finish();
    t.toObject(t.decode(bytes), { longs: Number, enums: String, defaults: false, arrays: true });
  }
  const nt = encodeNameTable({
    table: { 'web.warm.local': { ips: ['10.0.0.1'], registry: 'Kubernetes', shortname: 'web', namespace: 'warm' } },
  });
  const any = Buffer.concat([
    Buffer.from([0x0a, NAME_TABLE_TYPE.length]),
    Buffer.from(NAME_TABLE_TYPE),
    Buffer.from([0x12, nt.length]),
    Buffer.from(nt),
  ]);
  decodeNameTable(any);
}

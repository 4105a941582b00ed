// Config files for the discovery tests (a service with versioned loopback backends, routing rules) and a stack
// of discovery server + real Envoy + backends that stop together.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { type DiscoveryOptions, DiscoveryServer } from '../../lib/discovery/index';
import { type Backend, startBackend, startEnvoy, type TestEnvoy } from './discovery-envoy';
import { freePort, type TempDir, tempDir } from './harness';

export const HOST = 'web.test.local';

export function serviceEntry(port: number, backends: { port: number; version: string }[], host = HOST): string {
  return `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: ${host.split('.')[0]}
  namespace: test
spec:
  hosts: [${host}]
  ports:
  - {number: ${port}, name: http, protocol: HTTP}
  endpoints:
${backends.map((b) => `  - {address: 127.0.0.1, ports: {http: ${b.port}}, labels: {version: ${b.version}}}`).join('\n')}
`;
}

export function destinationRule(versions: string[]): string {
  return `apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: web, namespace: test}
spec:
  host: ${HOST}
  trafficPolicy: {loadBalancer: {simple: ROUND_ROBIN}}
  subsets:
${versions.map((v) => `  - {name: ${v}, labels: {version: ${v}}}`).join('\n')}
`;
}

/** A VirtualService whose last route splits by weight; `extra` routes (YAML list items) come first. */
export function virtualService(weights: Record<string, number>, extra = '', gateways: string[] = []): string {
  return `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: web, namespace: test}
spec:
  hosts: [${HOST}]
${gateways.length ? `  gateways: [${gateways.join(', ')}]\n` : ''}  http:
${extra}  - name: split
    route:
${Object.entries(weights).map(([v, w]) => `    - destination: {host: ${HOST}, subset: ${v}}\n      weight: ${w}`).join('\n')}
`;
}

export function gateway(port: number): string {
  return `apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: test}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: ${port}, name: http, protocol: HTTP}
    bind: 127.0.0.1
    hosts: ["*"]
`;
}

export interface Stack {
  dir: TempDir;
  server: DiscoveryServer;
  envoys: TestEnvoy[];
  backends: Record<string, Backend>;
  servicePort: number;
  write(file: string, text: string): void;
  addEnvoy(kind: 'sidecar' | 'router', delta: boolean): Promise<TestEnvoy>;
  stop(): Promise<void>;
}

/** Backends named by `versions`, a service port, and the files `files(ports)` returns, served to Envoys added later. */
export async function startStack(
  versions: string[],
  files: (s: { servicePort: number; backends: Record<string, Backend> }) => Record<string, string>,
  serverOptions: Partial<DiscoveryOptions> = {},
): Promise<Stack> {
  const dir = tempDir('pa-disc-');
  const backends: Record<string, Backend> = {};
  const envoys: TestEnvoy[] = [];
  let server: DiscoveryServer | undefined;
  const stop = async () => {
    await Promise.all(envoys.map((e) => e.stop()));
    await server?.close();
    await Promise.all(Object.values(backends).map((b) => b.close()));
    dir.cleanup();
  };
  try {
    for (const v of versions) backends[v] = await startBackend(v);
    const servicePort = await freePort();
    const write = (file: string, text: string) => {
      // Write-then-rename, as editors and config management do, so the watcher never reads half a file.
      const tmp = path.join(dir.path, `.${file}.tmp`);
      fs.writeFileSync(tmp, text);
      fs.renameSync(tmp, path.join(dir.path, file));
    };
    for (const [f, t] of Object.entries(files({ servicePort, backends }))) write(f, t);
    server = new DiscoveryServer({ configDir: dir.path, listen: `unix:${path.join(dir.path, 'xds.sock')}`, ...serverOptions });
    await server.start();
    const s = server;
    return {
      dir, server: s, envoys, backends, servicePort, write, stop,
      async addEnvoy(kind, delta) {
        const e = await startEnvoy({
          xdsAddress: s.address,
          nodeId: `${kind}~127.0.0.1~${kind}-${envoys.length}.test~test.svc.cluster.local`,
          delta,
          labels: kind === 'router' ? { istio: 'ingressgateway' } : {},
        });
        envoys.push(e);
        return e;
      },
    };
  } catch (e) {
    await stop();
    throw e;
  }
}

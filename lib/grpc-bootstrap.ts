// The gRPC xDS bootstrap (GRPC_XDS_BOOTSTRAP) for proxyless gRPC: the file a gRPC library reads to find its xDS
// server (this agent's XDS socket), its node, and the certificate files of the `file_watcher` provider. Written as
// Istio's agent writes it (pkg/istio-agent/grpcxds/grpc_bootstrap.go): the same fields, in the same order, the
// node metadata with GENERATOR=grpc so the control plane answers with its gRPC generator. Pure: values in, text out.

import * as path from 'node:path';

/** The LDS name a gRPC xDS server subscribes to, `%s` being its listening `IP:port` (Istio's grpcxds constant). */
export const SERVER_LISTENER_PREFIX = 'xds.istio.io/grpc/lds/inbound/';
export const SERVER_LISTENER_TEMPLATE = `${SERVER_LISTENER_PREFIX}%s`;
/** How often gRPC re-reads the certificate files (Istio writes 15 minutes). */
const REFRESH_INTERVAL = '900s';

export interface GrpcBootstrapInput {
  nodeId: string;
  metadata: Readonly<Record<string, unknown>>;
  locality: Readonly<{ region?: string; zone?: string; sub_zone?: string }>;
  /** The agent's XDS socket (`<configPath>/XDS`). */
  xdsSocket: string;
  /** OUTPUT_CERTS: where the agent writes key.pem, cert-chain.pem and root-cert.pem; none, no certificate provider. */
  certDir?: string;
  /** To resolve a relative socket path (the agent's working directory). */
  cwd: string;
}

export interface FileWatcherFiles {
  certificate_file: string;
  private_key_file: string;
  ca_certificate_file: string;
}

export function grpcBootstrap(i: GrpcBootstrapInput): Record<string, unknown> {
  const out: Record<string, unknown> = {
    xds_servers: [
      {
        // Istio writes `unix:///` + `<configPath>/XDS`, which names the absolute path when configPath is relative to
        // `/` (its image); the absolute path here means the same socket whatever the working directory.
        server_uri: `unix://${path.resolve(i.cwd, i.xdsSocket)}`,
        channel_creds: [{ type: 'insecure' }],
        server_features: ['xds_v3'],
      },
    ],
    node: {
      id: i.nodeId,
      metadata: sortKeys({ ...i.metadata, GENERATOR: 'grpc' }),
      // Go's encoding/json of the Node proto: empty fields left out, the oneof always there as null.
      locality: {
        ...(i.locality.region && { region: i.locality.region }),
        ...(i.locality.zone && { zone: i.locality.zone }),
        ...(i.locality.sub_zone && { sub_zone: i.locality.sub_zone }),
      },
      UserAgentVersionType: null,
    },
  };
  if (i.certDir) {
    const files: FileWatcherFiles & { refresh_interval: string } = {
      certificate_file: path.posix.join(i.certDir, 'cert-chain.pem'),
      private_key_file: path.posix.join(i.certDir, 'key.pem'),
      ca_certificate_file: path.posix.join(i.certDir, 'root-cert.pem'),
      refresh_interval: REFRESH_INTERVAL,
    };
    out.certificate_providers = { default: { plugin_name: 'file_watcher', config: files } };
  }
  out.server_listener_resource_name_template = SERVER_LISTENER_TEMPLATE;
  return out;
}

/** The file's text: Go's json.MarshalIndent (two spaces, HTML-safe escapes, no final newline). */
export function renderGrpcBootstrap(i: GrpcBootstrapInput): string {
  const escape = (c: string) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`;
  return JSON.stringify(grpcBootstrap(i), null, 2).replace(/[<>&\u2028\u2029]/g, escape);
}

/** The certificate files a bootstrap's `file_watcher` provider names (what readiness waits for), if it has one. */
export function fileWatcherFiles(bootstrap: unknown): string[] | undefined {
  type Provider = { plugin_name?: unknown; config?: Partial<FileWatcherFiles> };
  const providers = (bootstrap as { certificate_providers?: Record<string, Provider> })?.certificate_providers;
  for (const p of Object.values(providers ?? {})) {
    if (p?.plugin_name !== 'file_watcher') continue;
    const c = p.config ?? {};
    const files = [c.certificate_file, c.private_key_file, c.ca_certificate_file];
    return files.filter((f): f is string => typeof f === 'string' && f !== '');
  }
  return undefined;
}

// The metadata goes through a Go map on its way to the file, so every object's keys come out sorted.
function sortKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (!v || typeof v !== 'object') return v;
  const out: Record<string, unknown> = {};
  for (const k of Object.keys(v).sort()) out[k] = sortKeys((v as Record<string, unknown>)[k]);
  return out;
}

// Chooses how the agent gets its workload identity, from the config, as Istio decides: mounted certificates when
// present, else a CA (CA_ADDR or the discovery address; in standalone mode the embedded discovery server's CA
// when the config directory declares identities). Returns the secret cache and the SDS server for agent.ts to
// connect and start; standalone without a CA, they serve only the certificate files the config names (a Gateway's
// serverCertificate, a DestinationRule's caCertificates) and no workload certificate. When another SDS server (e.g.
// SPIRE's agent) served the workload socket at start (cfg.sockets.externalSds), Envoy takes its identity from that
// one and the agent serves only file certificates, on cfg.sdsServeSocket, as Go's ServeOnlyFiles.
// Undefined when a server appeared on the agent's socket since: then Envoy uses that one.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { CaClient, caClientOptions } from './ca-client';
import type { AgentConfig } from './config';
import { spiffeId, workloadKeyAlgorithm } from './csr';
import * as envs from './env';
import type { Env } from './env';
import { SdsServer } from './sds-server';
import { mountedCertsDir, SecretCache } from './secret-cache';
import { scope } from './log';
import { socketInUse } from './unix-socket';

const log = scope('identity');

/** Istio's fixed path of the plugged-in CA's CRL (pkg/security CACRLFilePath, the istio-ca-crl config map). */
export const CA_CRL_FILE = '/var/run/secrets/istio/crl/ca-crl.pem';

export interface WorkloadIdentity {
  cache: SecretCache;
  sds: SdsServer;
  /** Where certificates come from, for the start-up log. */
  source: string;
  /** The CA client, when there is one (its call metrics). */
  signer?: CaClient;
}

/**
 * `standaloneSocket`: the embedded discovery server's socket, in `proxy --standalone`. What the caller (agent.ts binds
 * the SDS socket before Envoy's spawn) found already: `sdsServedElsewhere`, whether another server serves the socket;
 * `sdsUnavailable`, why the socket could not be bound (then the start fails, unless there is no CA and there are no
 * mounted certificates: a standalone proxy without identities runs without SDS, as it did before file certificates).
 */
export async function workloadIdentity(
  cfg: AgentConfig,
  env: Env,
  standaloneSocket?: string,
  seen: { sdsServedElsewhere?: boolean; sdsUnavailable?: Error } = {},
): Promise<WorkloadIdentity | undefined> {
  const filesOnly = cfg.sockets.externalSds;
  if (seen.sdsServedElsewhere ?? (await socketInUse(cfg.sdsServeSocket))) {
    log.info(`an SDS server already serves ${cfg.sdsServeSocket}; Envoy uses it and the agent serves no secrets`);
    return undefined;
  }
  const mounted = filesOnly
    ? undefined
    : mountedCertsDir(envs.FILE_MOUNTED_CERTS.get(env), undefined, envs.OUTPUT_CERTS.get(env));
  let signer: CaClient | undefined;
  if (!mounted && !filesOnly) {
    if (standaloneSocket) {
      // The embedded CA's own test (lib/discovery/ca.ts caDeclared), not imported: that module is the CA server.
      if (fs.existsSync(path.join(cfg.standaloneDir, 'ca', 'identities'))) {
        const o = caClientOptions(cfg, env);
        signer = new CaClient({
          ...o,
          address: `unix:${path.resolve(standaloneSocket)}`,
          tls: false,
          headers: { ClusterID: cfg.clusterId },
        });
      }
    } else {
      signer = new CaClient(caClientOptions(cfg, env));
    }
  }
  if (seen.sdsUnavailable) {
    if (mounted || signer) throw seen.sdsUnavailable;
    log.warn(
      `no SDS server: ${seen.sdsUnavailable.message}; Envoy gets no file certificates (make ${path.dirname(cfg.sdsServeSocket)} writable to serve them)`,
    );
    return undefined;
  }
  const cache = new SecretCache({
    identity: spiffeId(cfg.trustDomain, cfg.podNamespace || 'default', cfg.serviceAccount || 'default'),
    algorithm: workloadKeyAlgorithm(env),
    pkcs8: envs.PKCS8_KEY.get(env),
    ttlMs: envs.SECRET_TTL.get(env),
    graceRatio: envs.SECRET_GRACE_PERIOD_RATIO.get(env),
    graceJitter: envs.SECRET_GRACE_PERIOD_RATIO_JITTER.get(env),
    signer,
    mountedDir: mounted,
    outputDir: envs.OUTPUT_CERTS.get(env) || undefined,
    // As Istio (nodeagent/util OutputKeyCertToDir): on Kubernetes the pod's other containers (Prometheus scraping
    // with Istio certificates) read them, so they are 0644 there, the key included.
    outputMode: envs.KUBERNETES_SERVICE_HOST.isSet(env) ? 0o644 : 0o600,
    debounceMs: envs.FILE_DEBOUNCE_DURATION.get(env),
    // file-cert:/file-root: files are served only if the uid that can connect to the SDS socket could read them.
    sdsSocket: cfg.sdsServeSocket,
    crlFile: envs.PILOT_ENABLE_CA_CRL.get(env) ? CA_CRL_FILE : undefined,
    // As the Go agent (security/pkg/nodeagent/sds/sdsservice.go, "Pre-generate workload certificates to improve
    // startup latency"): the certificate is asked for at start, so it is there when Envoy's first listener needs
    // it; readiness waits for it only once Envoy asks, so a proxy whose config uses no mTLS is not held unready.
    lazy: true,
    prefetch: true,
  });
  const sds = new SdsServer({
    socketPath: cfg.sdsServeSocket,
    provider: cache,
    maxNamesPerStream: envs.SDS_MAX_NAMES_PER_STREAM.get(env),
  });
  return {
    cache,
    sds,
    signer,
    source: mounted
      ? `files in ${mounted}`
      : signer
        ? `CA ${signer.address}`
        : filesOnly
          ? `file certificates only (${cfg.sdsSocket} serves the workload identity)`
          : 'file certificates only (no CA)',
  };
}

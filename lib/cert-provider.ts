// CA_PROVIDER and PILOT_CERT_PROVIDER, as Istio's agent reads them (pkg/istio-agent/plugins.go, agent.go
// FindRootCAForCA/FindRootCAForXDS, pilot/cmd/pilot-agent/options/security.go). Pure: values in, values out.
//
// CA_PROVIDER names the CA client: Istio's open-source agent registers only "Citadel" (the Istio CA protocol this
// agent speaks) and fails at start for any other name. PILOT_CERT_PROVIDER says who signed istiod's certificate,
// which decides where the agent looks for the root that verifies istiod when CA_ROOT_CA / XDS_ROOT_CA are unset.
// Pure but for startupRootCheck, which reads the registry and asks whether a file exists.

import * as envs from './env';
import type { Env } from './env';
import { AgentError, quote } from './errors';

/** Istio's default root locations (pkg/istio-agent): the older mounted layout, and istiod's config map. */
export const MOUNTED_ROOT_CA = './etc/certs/root-cert.pem';
export const ISTIOD_ROOT_CA = './var/run/secrets/istio/root-cert.pem';

export const CITADEL = 'Citadel';
const GKE_WORKLOAD_CERTIFICATE = 'GkeWorkloadCertificate';

/** Istio's values (pkg/config/constants CertProvider*); a k8s.io/ signer name means a Kubernetes signer. */
export type PilotCertProvider = 'istiod' | 'kubernetes' | 'custom' | 'none';

export function pilotCertProvider(raw: string): PilotCertProvider {
  if (raw === 'istiod' || raw === 'kubernetes' || raw === 'custom' || raw === 'none') return raw;
  if (raw.startsWith('k8s.io/')) return 'kubernetes';
  const want = 'want istiod, kubernetes, k8s.io/<signer>, custom or none';
  throw new AgentError('CONFIG_INVALID', `invalid PILOT_CERT_PROVIDER ${quote(raw)} (${want})`);
}

/**
 * Throws unless the CA client CA_PROVIDER names is the one this agent has. `caAddress`: the CA the agent will
 * call; Istio switches to Google's CA client (GoogleCA, not in the open-source agent either) for a googleapis.com one.
 */
export function checkCaProvider(caProvider: string, caAddress: string): void {
  if (caProvider === GKE_WORKLOAD_CERTIFICATE) {
    throw new AgentError(
      'CONFIG_INVALID',
      `CA_PROVIDER=${GKE_WORKLOAD_CERTIFICATE} (GKE workload certificates) is not ` +
        'supported: mount the certificates as ./etc/certs/{cert-chain,key,root-cert}.pem and set FILE_MOUNTED_CERTS=true',
    );
  }
  if (caProvider !== CITADEL) {
    throw new AgentError(
      'CONFIG_INVALID',
      `CA provider ${quote(caProvider)} (CA_PROVIDER) is not registered: this agent has only ${CITADEL}, Istio's CA protocol`,
    );
  }
  if (caAddress.includes('googleapis.com')) {
    throw new AgentError(
      'CONFIG_INVALID',
      `CA ${caAddress} is Google's CA (Istio's GoogleCA provider), which this agent does not support`,
    );
  }
}

/** Where the root that verifies the CA or the discovery server is, when CA_ROOT_CA / XDS_ROOT_CA leave it unset. */
export interface RootDefaults {
  /** PROV_CERT: its root-cert.pem is used. */
  provCert: string;
  /** ./etc/certs/root-cert.pem (mounted, Istio's older layout): path, and whether it exists now. */
  mounted: string;
  mountedExists: boolean;
  /** ./var/run/secrets/istio/root-cert.pem, the istio-ca-root-cert config map. */
  istiod: string;
}

/**
 * As Istio's FindRootCAForCA and FindRootCAForXDS: an existing mounted root (for the CA also a missing one with
 * custom, which says istiod's certificate comes from there); PROV_CERT's root; none -> an error (nothing says
 * where the root is); otherwise istiod's config map.
 */
export function defaultRoot(provider: PilotCertProvider, d: RootDefaults, what: 'CA' | 'XDS'): string {
  if (d.mountedExists || (provider === 'custom' && what === 'CA')) return d.mounted;
  if (d.provCert) return `${d.provCert}/root-cert.pem`;
  if (provider === 'none') {
    throw new AgentError(
      'CONFIG_INVALID',
      `a root CA file for ${what} is required (set ${what}_ROOT_CA) but PILOT_CERT_PROVIDER is none`,
    );
  }
  return d.istiod;
}

/**
 * At start, before anything is written: with PILOT_CERT_PROVIDER=none a TLS discovery server needs a root from
 * XDS_ROOT_CA, PROV_CERT or the mounted layout (the CA's is checked when its client is made). `tls`: the
 * discovery connection uses TLS.
 */
export function startupRootCheck(env: Env, tls: boolean, exists: (p: string) => boolean): void {
  const provider = pilotCertProvider(envs.PILOT_CERT_PROVIDER.get(env));
  if (provider !== 'none' || !tls || envs.XDS_ROOT_CA.get(env)) return;
  const provCert = envs.PROV_CERT.get(env);
  // Go looks at the mounted certificates' ISTIO_META_TLS_CLIENT_ROOT_CERT before it checks for none.
  const credentials = './var/run/secrets/workload-spiffe-credentials';
  const fileMounted =
    envs.FILE_MOUNTED_CERTS.get(env) ||
    ['cert-chain.pem', 'key.pem', 'root-cert.pem'].every((f) => exists(`${credentials}/${f}`));
  if (!provCert && fileMounted && envs.ISTIO_META_TLS_CLIENT_ROOT_CERT.get(env)) return;
  defaultRoot(
    provider,
    { provCert, mounted: MOUNTED_ROOT_CA, mountedExists: exists(MOUNTED_ROOT_CA), istiod: ISTIOD_ROOT_CA },
    'XDS',
  );
}

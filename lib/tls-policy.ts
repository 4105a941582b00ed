// COMPLIANCE_POLICY as Istio applies it on the agent's side (pkg/features/security.go, pkg/model/fips.go,
// pkg/envoy/proxy.go): the agent's own TLS clients (xDS upstream and CA, Go's getTLSDialOption ->
// EnforceGoCompliance) get the policy's versions, TLS 1.2 cipher suites and curves, and Envoy's environment gets
// GRPC_SSL_CIPHER_SUITES for its Google gRPC client under the FIPS policies; fips-140-2's runtime flag is in
// lib/bootstrap.ts. Envoy's listeners and clusters are the control plane's to restrict: envoyCompliance() is what
// istiod's EnforceCompliance does to the TLS parameters it generates, for the embedded discovery server.
// An unknown policy is warned about and ignored, as Go does. node:tls and gRPC load only when a context or
// credentials are made: the supervisor imports envoyEnvironment() before Envoy's spawn, when neither is loaded yet.

import type * as tls from 'node:tls';
import { AgentError, errorMessage } from './errors';
import { scope } from './log';

const log = scope('tls');

export const FIPS_140_2 = 'fips-140-2';
export const FIPS_140_3 = 'fips-140-3';
export const PQC = 'pqc';

/** Go's fipsCiphers: ECDHE_[RSA|ECDSA]_WITH_AES_*_GCM_SHA* (OpenSSL names). */
export const FIPS_TLS12_CIPHERS = [
  'ECDHE-ECDSA-AES128-GCM-SHA256',
  'ECDHE-RSA-AES128-GCM-SHA256',
  'ECDHE-ECDSA-AES256-GCM-SHA384',
  'ECDHE-RSA-AES256-GCM-SHA384',
].join(':');
const TLS13_AES_GCM = 'TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384';
const FIPS_CIPHER_LIST = FIPS_TLS12_CIPHERS.split(':');

export interface TlsRestriction {
  minVersion: tls.SecureVersion;
  maxVersion: tls.SecureVersion;
  /** TLS 1.3 and 1.2 suites, one OpenSSL list as Node takes it. */
  ciphers: string;
  ecdhCurve: string;
}

const warned = new Set<string>();

/**
 * What the policy allows the agent's TLS clients, or undefined for no restriction (unset, or unknown: warned once).
 * fips-140-3 also limits TLS 1.3 to AES-GCM, which Go leaves to its FIPS module (GODEBUG=fips140=only).
 */
export function tlsRestriction(policy: string | undefined): TlsRestriction | undefined {
  switch (policy ?? '') {
    case '':
      return undefined;
    case FIPS_140_2:
      return { minVersion: 'TLSv1.2', maxVersion: 'TLSv1.2', ciphers: FIPS_TLS12_CIPHERS, ecdhCurve: 'P-256' };
    case FIPS_140_3:
      return {
        minVersion: 'TLSv1.2',
        maxVersion: 'TLSv1.3',
        ecdhCurve: 'P-256:P-384',
        ciphers: `${TLS13_AES_GCM}:${FIPS_TLS12_CIPHERS}`,
      };
    case PQC:
      return { minVersion: 'TLSv1.3', maxVersion: 'TLSv1.3', ciphers: TLS13_AES_GCM, ecdhCurve: 'X25519MLKEM768' };
    default:
      warnUnknown(policy!);
      return undefined;
  }
}

function warnUnknown(policy: string): void {
  if (!warned.has(policy))
    log.warn(`unknown compliance policy: "${policy}" (COMPLIANCE_POLICY); TLS is not restricted`);
  warned.add(policy);
}

/** Envoy's TlsParameters, as the discovery server writes them (snake_case, enum names). */
export type EnvoyTlsParams = Record<string, unknown>;

/**
 * What istiod's EnforceCompliance (pkg/model/fips.go) makes of the TlsParameters of a TLS context it generates,
 * or undefined when the policy restricts nothing (unset, or unknown: warned once). fips-140-2: TLS 1.2 only, cipher
 * suites (where set) filtered to the four ECDHE AES-GCM ones, ecdh_curves cleared (Envoy's default; a FIPS build of
 * Envoy then offers only FIPS suites and P-256); fips-140-3: Envoy's FIPS_202205 compliance policy added; pqc: at
 * least TLS 1.3, the four suites, X25519MLKEM768.
 */
export function envoyCompliance(policy: string | undefined): ((params: EnvoyTlsParams) => EnvoyTlsParams) | undefined {
  switch (policy ?? '') {
    case '':
      return undefined;
    case FIPS_140_2:
      return (params) => {
        const { ecdh_curves: _, cipher_suites: suites, ...rest } = params;
        const kept = ((suites as string[] | undefined) ?? []).filter((c) => FIPS_CIPHER_LIST.includes(c));
        return {
          ...rest,
          tls_minimum_protocol_version: 'TLSv1_2',
          tls_maximum_protocol_version: 'TLSv1_2',
          ...(kept.length && { cipher_suites: kept }),
        };
      };
    case FIPS_140_3:
      return (params) => ({ ...params, compliance_policies: ['FIPS_202205'] });
    case PQC:
      return (params) => ({
        ...params,
        tls_minimum_protocol_version: 'TLSv1_3',
        cipher_suites: FIPS_CIPHER_LIST,
        ecdh_curves: ['X25519MLKEM768'],
      });
    default:
      warnUnknown(policy!);
      return undefined;
  }
}

/** Envoy's environment under the policy: Go appends GRPC_SSL_CIPHER_SUITES (so it wins over an inherited one). */
export function envoyEnvironment(policy: string | undefined, env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  if (policy !== FIPS_140_2 && policy !== FIPS_140_3) return env;
  return { ...env, GRPC_SSL_CIPHER_SUITES: FIPS_TLS12_CIPHERS };
}

/** The PEM material of one TLS client: the roots to trust (else the system's) and a client certificate. */
export interface TlsClientPem {
  ca?: Buffer;
  key?: Buffer;
  cert?: Buffer;
}

/**
 * A secure context with the policy's restriction and the PEM material, or undefined when the policy restricts
 * nothing. A restriction OpenSSL cannot apply is a CONFIG_INVALID naming COMPLIANCE_POLICY.
 */
export function restrictedContext(policy: string | undefined, pem: TlsClientPem): tls.SecureContext | undefined {
  const r = tlsRestriction(policy);
  if (!r) return undefined;
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    return (require('node:tls') as typeof tls).createSecureContext({ ...r, ...pem });
  } catch (e) {
    throw new AgentError(
      'CONFIG_INVALID',
      `cannot set up TLS under COMPLIANCE_POLICY=${policy}: ${errorMessage(e)}`,
      e,
    );
  }
}

/** tls.connect options for the agent's TLS clients: the PEM material, restricted by the policy when there is one. */
export function clientTlsOptions(policy: string | undefined, pem: TlsClientPem): tls.ConnectionOptions {
  const secureContext = restrictedContext(policy, pem);
  return secureContext ? { secureContext } : pem;
}

// TLS origination: a DestinationRule's `tls` SIMPLE or MUTUAL as istiod's cluster builder turns it into an
// UpstreamTlsContext (istio/istio 86c9f01f, pilot/pkg/networking/core/cluster_tls.go constructUpstreamTLS,
// setAutoSniAndAutoSanValidation; pilot/pkg/security/model/authentication.go ApplyCustomSDSToClientCommonTLSContext).
// - credentialName: only on a router (istiod gives a sidecar no TLS for it without a workloadSelector): the client
//   certificate `kubernetes://<name>` (MUTUAL) and the CA `kubernetes://<name>-cacert`, over ADS from this server;
// - files: `file-cert:<clientCertificate>~<privateKey>` (MUTUAL) and `file-root:<caCertificates>` (`file-root:system`
//   when none is given, as VERIFY_CERTIFICATE_AT_CLIENT does), from the agent's SDS through `sds-grpc`;
// - insecureSkipVerify: no validation context at all;
// - no `sni`: auto_sni (the request's Host), and auto_san_validation when no subjectAltNames are given.
// - COMPLIANCE_POLICY: the TLS parameters restricted as istiod's EnforceCompliance does (../tls-policy.ts).

import { packAny } from '../envoy-protos';
import type { EnvoyTlsParams } from '../tls-policy';
import { credentialCaResource, credentialResource } from './gen-secrets';
import type { ClientTls } from './model';
import { ADS_SOURCE } from './resources';

const UPSTREAM_TLS = 'envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext';

export interface OriginationFields {
  /** The cluster's transport_socket; absent when the setting gives no TLS (credentialName on a sidecar). */
  socket?: Record<string, unknown>;
  /** HttpProtocolOptions.upstream_http_protocol_options. */
  httpOptions?: Record<string, unknown>;
}

/** istiod's defaultUpstreamCommonTLSContext parameters. */
export const ISTIOD_UPSTREAM_TLS_PARAMS: Readonly<EnvoyTlsParams> = Object.freeze({
  tls_minimum_protocol_version: 'TLSv1_2',
  tls_maximum_protocol_version: 'TLSv1_3',
});

export const originates = (tls: ClientTls | undefined): tls is ClientTls =>
  tls?.mode === 'SIMPLE' || tls?.mode === 'MUTUAL';

export function originationFields(
  tls: ClientTls,
  router: boolean,
  h2: boolean,
  sdsSource: Readonly<Record<string, unknown>>,
  compliance?: (params: EnvoyTlsParams) => EnvoyTlsParams,
): OriginationFields {
  if (tls.credentialName !== undefined && !router) return {};
  const mutual = tls.mode === 'MUTUAL';
  const skip = tls.insecureSkipVerify === true;
  const sans = tls.subjectAltNames.map((s) => ({ exact: s }));
  const params = { ...ISTIOD_UPSTREAM_TLS_PARAMS };
  const common: Record<string, unknown> = { tls_params: compliance ? compliance(params) : params };
  if (tls.credentialName !== undefined) {
    if (mutual)
      common.tls_certificate_sds_secret_configs = [
        { name: credentialResource(tls.credentialName), sds_config: ADS_SOURCE },
      ];
    if (!skip) {
      common.combined_validation_context = {
        default_validation_context: { match_subject_alt_names: sans },
        validation_context_sds_secret_config: {
          name: credentialCaResource(tls.credentialName),
          sds_config: ADS_SOURCE,
        },
      };
    }
  } else {
    if (mutual)
      common.tls_certificate_sds_secret_configs = [
        { name: `file-cert:${tls.clientCertificate}~${tls.privateKey}`, sds_config: sdsSource },
      ];
    if (skip) common.validation_context = {};
    else {
      common.combined_validation_context = {
        default_validation_context: { match_subject_alt_names: sans },
        validation_context_sds_secret_config: {
          name: `file-root:${tls.caCertificates ?? 'system'}`,
          sds_config: sdsSource,
        },
      };
    }
  }
  if (h2) common.alpn_protocols = ['h2'];
  const ctx: Record<string, unknown> = { common_tls_context: common };
  if (tls.sni !== undefined) ctx.sni = tls.sni;
  const out: OriginationFields = {
    socket: { name: 'envoy.transport_sockets.tls', typed_config: packAny(UPSTREAM_TLS, ctx) },
  };
  const autoSni = tls.sni === undefined;
  const autoSan = autoSni && !sans.length && !skip;
  if (autoSni || autoSan)
    out.httpOptions = { ...(autoSni && { auto_sni: true }), ...(autoSan && { auto_san_validation: true }) };
  return out;
}

// SDS over ADS: the `kind: Secret` documents a Gateway's or DestinationRule's credentialName names, served as istiod
// serves Kubernetes secrets (istio/istio 86c9f01f, pilot/pkg/xds/sds.go): `kubernetes://<name>` is the certificate
// chain and key, `kubernetes://<name>-cacert` the trust bundle (the Secret's own ca.crt, else that of a Secret named
// `<name>-cacert`). A proxy gets the Secrets of its own namespace, and only a router: istiod serves credentials to
// gateways, not to sidecars. istiod sends keys only to a proxy whose authenticated identity may read the Secret, over
// its TLS stream. This server's stream is plaintext, so a key goes only over a Unix socket or loopback (see
// PushContext.servePrivateKeys) AND only to a router authenticated as an identity of the Secret's namespace
// (./xds-auth.ts); an anonymous router of that namespace gets the CA bundles only.

import type { Config, SecretSpec } from './model';
import type { Proxy } from './proxy';
import type { PushContext } from './push-context';
import { encodeResource, type Resource, SECRET } from './resources';

export const CREDENTIAL_PREFIX = 'kubernetes://';
export const CA_SUFFIX = '-cacert';

// The agent's SDS server, through the bootstrap's sds-grpc cluster: files and the workload certificate.
export const SDS_SOURCE = Object.freeze({
  api_config_source: {
    api_type: 'GRPC',
    transport_api_version: 'V3',
    set_node_on_first_message_only: true,
    grpc_services: [{ envoy_grpc: { cluster_name: 'sds-grpc' } }],
  },
  initial_fetch_timeout: { seconds: 0, nanos: 0 },
  resource_api_version: 'V3',
});

/** The SDS resource names a credentialName becomes. */
export const credentialResource = (name: string) => `${CREDENTIAL_PREFIX}${name}`;
export const credentialCaResource = (name: string) => `${CREDENTIAL_PREFIX}${name}${CA_SUFFIX}`;

export function buildSecrets(push: PushContext, proxy: Proxy): ReadonlyMap<string, Resource> {
  if (proxy.type !== 'router') return new Map();
  const keys = push.servePrivateKeys && proxy.identity?.namespace === proxy.namespace;
  return push.memoize(`sds|${proxy.namespace}|${keys ? 'keys' : 'ca'}`, () => {
    const secrets = push.secrets.filter((s) => s.meta.namespace === proxy.namespace);
    const byName = new Map(secrets.map((s) => [s.meta.name, s] as const));
    const out = new Map<string, Resource>();
    for (const s of secrets) {
      if (s.spec.cert && s.spec.key && keys) {
        const name = credentialResource(s.meta.name);
        out.set(
          name,
          encodeResource(SECRET, name, {
            name,
            tls_certificate: {
              certificate_chain: { inline_bytes: Buffer.from(s.spec.cert) },
              private_key: { inline_bytes: Buffer.from(s.spec.key) },
            },
          }),
        );
      }
      const ca = caOf(s, byName);
      if (ca) {
        const name = credentialCaResource(s.meta.name);
        out.set(
          name,
          encodeResource(SECRET, name, { name, validation_context: { trusted_ca: { inline_bytes: Buffer.from(ca) } } }),
        );
      }
    }
    return out;
  });
}

/** The trust bundle a credential name's `-cacert` resource serves: its own ca.crt, else `<name>-cacert`'s. */
export function caOf(s: Config<SecretSpec>, byName: ReadonlyMap<string, Config<SecretSpec>>): string | undefined {
  return s.spec.ca ?? byName.get(`${s.meta.name}${CA_SUFFIX}`)?.spec.ca;
}

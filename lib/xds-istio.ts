// Istio's own xDS types that the agent handles (never forwarded to Envoy). The schema mirrors proto/istio/*.proto
// (the readable source); it lives here as a descriptor so the single-file bundle needs no .proto files at run time.

import type * as protobuf from 'protobufjs';
import { unpackAnyBytes } from './xds-codec';

export const NAME_TABLE_TYPE = 'type.googleapis.com/istio.networking.nds.v1.NameTable';
export const PROXY_CONFIG_TYPE = 'type.googleapis.com/istio.mesh.v1alpha1.ProxyConfig';
export const HEALTH_INFO_TYPE = 'type.googleapis.com/istio.v1.HealthInformation';

const nameInfo = {
  fields: {
    ips: { rule: 'repeated', type: 'string', id: 1 },
    registry: { type: 'string', id: 2 },
    shortname: { type: 'string', id: 3 },
    namespace: { type: 'string', id: 4 },
    alt_hosts: { rule: 'repeated', type: 'string', id: 5, options: { deprecated: true } },
  },
};

export const ISTIO_DESCRIPTOR = {
  nested: {
    istio: {
      nested: {
        networking: {
          nested: {
            nds: {
              nested: {
                v1: {
                  nested: {
                    NameTable: {
                      fields: {
                        table: { keyType: 'string', type: 'NameInfo', id: 1 },
                        name_info: { type: 'NameInfo', id: 2 },
                      },
                      nested: { NameInfo: nameInfo },
                    },
                  },
                },
              },
            },
          },
        },
        v1: { nested: { HealthInformation: { fields: {} } } },
        // Only the field the agent reads (PCDS roots); protobufjs skips the others.
        mesh: {
          nested: {
            v1alpha1: {
              nested: {
                ProxyConfig: { fields: { ca_certificates_pem: { rule: 'repeated', type: 'string', id: 34 } } },
              },
            },
          },
        },
      },
    },
  },
};

let root: protobuf.Root | undefined;
/** protobufjs is loaded on first use: most agents never decode one of these (no DNS proxy, no health checks). */
export function istioRoot(): protobuf.Root {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  return (root ??= (require('protobufjs') as typeof protobuf).Root.fromJSON(ISTIO_DESCRIPTOR));
}

export interface NameInfo {
  ips: string[];
  registry: string;
  shortname: string;
  namespace: string;
}

export interface NameTable {
  table: Record<string, NameInfo>;
}

/** Decodes a NameTable from a resource's raw Any bytes (as an NDS handler receives them). */
export function decodeNameTable(any: Buffer): NameTable {
  const { typeUrl, value } = unpackAnyBytes(any);
  if (typeUrl !== NAME_TABLE_TYPE) throw new Error(`expected ${NAME_TABLE_TYPE}, got ${typeUrl || 'no type URL'}`);
  const t = istioRoot().lookupType('istio.networking.nds.v1.NameTable');
  const o = t.toObject(t.decode(value), { defaults: true, arrays: true, objects: true }) as {
    table: Record<string, NameInfo>;
  };
  return { table: o.table };
}

export function encodeNameTable(nt: NameTable): Uint8Array {
  const t = istioRoot().lookupType('istio.networking.nds.v1.NameTable');
  return t.encode(t.fromObject(nt)).finish();
}

/** ProxyConfig.caCertificatesPem from a pushed ProxyConfig (PCDS): the roots to add to ROOTCA. */
export function decodeProxyConfigCaCerts(any: Buffer): string[] {
  const { typeUrl, value } = unpackAnyBytes(any);
  if (typeUrl !== PROXY_CONFIG_TYPE) throw new Error(`expected ${PROXY_CONFIG_TYPE}, got ${typeUrl || 'no type URL'}`);
  const t = istioRoot().lookupType('istio.mesh.v1alpha1.ProxyConfig');
  return (t.toObject(t.decode(value), { arrays: true }) as { ca_certificates_pem: string[] }).ca_certificates_pem;
}

export function encodeProxyConfigCaCerts(pems: string[]): Uint8Array {
  const t = istioRoot().lookupType('istio.mesh.v1alpha1.ProxyConfig');
  return t.encode(t.fromObject({ ca_certificates_pem: pems })).finish();
}

// Istio's certificate service (istio.v1.auth.IstioCertificateService/CreateCertificate): the CSR the agent sends
// and the chain it gets back. The schema mirrors proto/istio/ca.proto (the readable source); it lives here as a
// descriptor so the single-file bundle needs no .proto files at run time. Used by the CA client and by the
// embedded CA of the discovery server.

import type * as grpc from '@grpc/grpc-js';
import * as protobuf from 'protobufjs';

export const CA_SERVICE = 'istio.v1.auth.IstioCertificateService';
export const CREATE_CERTIFICATE_PATH = `/${CA_SERVICE}/CreateCertificate`;

export const CA_DESCRIPTOR = {
  nested: {
    istio: {
      nested: {
        v1: {
          nested: {
            auth: {
              nested: {
                IstioCertificateRequest: {
                  fields: {
                    csr: { type: 'string', id: 1 },
                    validity_duration: { type: 'int64', id: 3 },
                    metadata: { type: 'google.protobuf.Struct', id: 4 },
                  },
                },
                IstioCertificateResponse: { fields: { cert_chain: { rule: 'repeated', type: 'string', id: 1 } } },
                IstioCertificateService: {
                  methods: { CreateCertificate: { requestType: 'IstioCertificateRequest', responseType: 'IstioCertificateResponse' } },
                },
              },
            },
          },
        },
      },
    },
    google: {
      nested: {
        protobuf: {
          nested: {
            Struct: { fields: { fields: { keyType: 'string', type: 'Value', id: 1 } } },
            Value: {
              oneofs: { kind: { oneof: ['nullValue', 'numberValue', 'stringValue', 'boolValue', 'structValue', 'listValue'] } },
              fields: {
                nullValue: { type: 'NullValue', id: 1 },
                numberValue: { type: 'double', id: 2 },
                stringValue: { type: 'string', id: 3 },
                boolValue: { type: 'bool', id: 4 },
                structValue: { type: 'Struct', id: 5 },
                listValue: { type: 'ListValue', id: 6 },
              },
            },
            NullValue: { values: { NULL_VALUE: 0 } },
            ListValue: { fields: { values: { rule: 'repeated', type: 'Value', id: 1 } } },
          },
        },
      },
    },
  },
};

export interface CertificateRequest {
  csr: string;
  /** Seconds. */
  validityDuration: number;
  /** String fields of the request's metadata Struct (Istio's `CertSigner`). */
  metadata?: Record<string, string>;
}

export interface CertificateResponse {
  certChain: string[];
}

let root: protobuf.Root | undefined;
function caRoot(): protobuf.Root {
  return (root ??= protobuf.Root.fromJSON(CA_DESCRIPTOR as unknown as protobuf.INamespace));
}
const requestType = () => caRoot().lookupType('istio.v1.auth.IstioCertificateRequest');
const responseType = () => caRoot().lookupType('istio.v1.auth.IstioCertificateResponse');

export function encodeCertificateRequest(r: CertificateRequest): Buffer {
  const t = requestType();
  const fields = Object.fromEntries(Object.entries(r.metadata ?? {}).map(([k, v]) => [k, { stringValue: v }]));
  const metadata = Object.keys(fields).length ? { metadata: { fields } } : {};
  return Buffer.from(t.encode(t.fromObject({ csr: r.csr, validity_duration: r.validityDuration, ...metadata })).finish());
}

/** Throws on bytes that are not an IstioCertificateRequest. */
export function decodeCertificateRequest(b: Buffer): CertificateRequest {
  const t = requestType();
  const o = t.toObject(t.decode(b), { longs: Number, defaults: true }) as {
    csr: string; validity_duration: number; metadata?: { fields?: Record<string, { stringValue?: string }> };
  };
  const metadata: Record<string, string> = {};
  for (const [k, v] of Object.entries(o.metadata?.fields ?? {})) if (typeof v.stringValue === 'string') metadata[k] = v.stringValue;
  return { csr: o.csr, validityDuration: o.validity_duration, ...(Object.keys(metadata).length ? { metadata } : {}) };
}

export function encodeCertificateResponse(r: CertificateResponse): Buffer {
  const t = responseType();
  return Buffer.from(t.encode(t.fromObject({ cert_chain: r.certChain })).finish());
}

/** Throws on bytes that are not an IstioCertificateResponse. */
export function decodeCertificateResponse(b: Buffer): CertificateResponse {
  const t = responseType();
  const o = t.toObject(t.decode(b), { arrays: true }) as { cert_chain: string[] };
  return { certChain: o.cert_chain };
}

/** The service for grpc-js (client and server), messages as plain objects. */
export const CA_SERVICE_DEFINITION: grpc.ServiceDefinition = {
  CreateCertificate: {
    path: CREATE_CERTIFICATE_PATH,
    requestStream: false,
    responseStream: false,
    originalName: 'createCertificate',
    requestSerialize: encodeCertificateRequest,
    requestDeserialize: decodeCertificateRequest,
    responseSerialize: encodeCertificateResponse,
    responseDeserialize: decodeCertificateResponse,
  },
};

// Istio's certificate service (istio.v1.auth.IstioCertificateService/CreateCertificate): the CSR the agent sends
// and the chain it gets back. The schema mirrors proto/istio/ca.proto (the readable source); CA_DESCRIPTOR is that
// schema as a protobufjs descriptor (test/ca-protos.test.ts checks both against each other and against this file's
// codec). The three messages are encoded and decoded by hand with the wire helpers of lib/xds-codec.ts: loading
// protobufjs and building its types was on the path to every sidecar's first certificate. Used by the CA client
// and by the embedded CA of the discovery server.

import type * as grpc from '@grpc/grpc-js';
import { AgentError } from './errors';
import { forEachField, Writer } from './xds-codec';

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
                  methods: {
                    CreateCertificate: {
                      requestType: 'IstioCertificateRequest',
                      responseType: 'IstioCertificateResponse',
                    },
                  },
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
              oneofs: {
                kind: { oneof: ['nullValue', 'numberValue', 'stringValue', 'boolValue', 'structValue', 'listValue'] },
              },
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

// Field numbers (proto/istio/ca.proto): IstioCertificateRequest csr 1, validity_duration 3 (int64), metadata 4
// (google.protobuf.Struct: fields 1, a map entry of key 1 and Value 2; Value.string_value 3);
// IstioCertificateResponse cert_chain 1 (repeated).
const WT_VARINT = 0;
const WT_LEN = 2;

function want(wt: number, expected: number, what: string, field: number): void {
  if (wt === expected) return;
  throw new AgentError('BAD_INPUT', `${what}: field ${field} has wire type ${wt}, want ${expected}`);
}

export function encodeCertificateRequest(r: CertificateRequest): Buffer {
  const w = new Writer().string(1, r.csr);
  // Seconds, never negative here (the agent asks for at least 1 s); 0 is the field's default and not written.
  w.varint(3, Math.max(0, Math.trunc(r.validityDuration)));
  const entries = Object.entries(r.metadata ?? {});
  if (entries.length) {
    const struct = new Writer();
    for (const [k, v] of entries) {
      const value = new Writer().lenField(3, Buffer.from(v, 'utf8')).finish();
      struct.lenField(1, new Writer().string(1, k).lenField(2, value).finish());
    }
    w.lenField(4, struct.finish());
  }
  return w.finish();
}

/** Throws on bytes that are not an IstioCertificateRequest. */
export function decodeCertificateRequest(b: Buffer): CertificateRequest {
  const what = 'IstioCertificateRequest';
  let csr = '';
  let validityDuration = 0;
  const metadata: Record<string, string> = {};
  forEachField(
    b,
    (f, wt, buf, s, e, v) => {
      if (f === 1) {
        want(wt, WT_LEN, what, f);
        csr = buf.toString('utf8', s, e);
      } else if (f === 3) {
        want(wt, WT_VARINT, what, f);
        // A negative int64 (two's complement, above 2^63 as read here) keeps only its sign: any value <= 0 asks
        // for the CA's default lifetime.
        validityDuration = v >= 2 ** 63 ? -1 : v;
      } else if (f === 4) {
        want(wt, WT_LEN, what, f);
        forEachField(
          buf.subarray(s, e),
          (sf, swt, sb, ss, se) => {
            if (sf !== 1) return;
            want(swt, WT_LEN, 'google.protobuf.Struct', sf);
            let key = '';
            let str: string | undefined;
            forEachField(
              sb.subarray(ss, se),
              (ef, ewt, eb, es, ee) => {
                if (ef === 1 && ewt === WT_LEN) key = eb.toString('utf8', es, ee);
                else if (ef === 2 && ewt === WT_LEN) {
                  str = undefined;
                  forEachField(
                    eb.subarray(es, ee),
                    (vf, vwt, vb, vs, ve) => {
                      if (vf === 3 && vwt === WT_LEN) str = vb.toString('utf8', vs, ve);
                    },
                    'google.protobuf.Value',
                  );
                }
              },
              'google.protobuf.Struct entry',
            );
            if (str !== undefined) metadata[key] = str;
          },
          'google.protobuf.Struct',
        );
      }
    },
    what,
  );
  return { csr, validityDuration, ...(Object.keys(metadata).length ? { metadata } : {}) };
}

export function encodeCertificateResponse(r: CertificateResponse): Buffer {
  const w = new Writer();
  // Every element is written, an empty one too (a repeated string keeps its count).
  for (const pem of r.certChain) w.lenField(1, Buffer.from(pem, 'utf8'));
  return w.finish();
}

/** Throws on bytes that are not an IstioCertificateResponse. */
export function decodeCertificateResponse(b: Buffer): CertificateResponse {
  const certChain: string[] = [];
  forEachField(
    b,
    (f, wt, buf, s, e) => {
      if (f !== 1) return;
      want(wt, WT_LEN, 'IstioCertificateResponse', f);
      certChain.push(buf.toString('utf8', s, e));
    },
    'IstioCertificateResponse',
  );
  return { certChain };
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

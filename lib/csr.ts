// A workload key and its certificate signing request: URI SAN spiffe://<trust domain>/ns/<ns>/sa/<sa>, empty
// subject (no CN), as Istio's CA expects. Pure: values in, values out (no files, clock or environment).
//
// X.509 and PKCS#10 come from @peculiar/x509 on Node's WebCrypto: it builds CSRs and certificates from typed
// ASN.1 schemas, so none is hand-encoded here; Node's own crypto has no CSR or certificate builder.

import { KeyObject, webcrypto } from 'node:crypto';
import { AgentError } from './errors';
import { x509 } from './x509';

export type KeyAlgorithm = { kind: 'ECDSA' } | { kind: 'RSA'; bits: number };

export interface KeyAndCsr {
  /** PEM private key: SEC1/PKCS#1 as Istio writes by default, PKCS#8 when asked. */
  keyPem: string;
  csrPem: string;
}

export function spiffeId(trustDomain: string, namespace: string, serviceAccount: string): string {
  return `spiffe://${trustDomain}/ns/${namespace}/sa/${serviceAccount}`;
}

/** ECC_SIGNATURE_ALGORITHM=ECDSA picks P-256; anything else set there is refused; otherwise RSA of rsaBits. */
export function keyAlgorithm(eccSignatureAlgorithm: string, rsaBits: number): KeyAlgorithm {
  const ecc = eccSignatureAlgorithm.trim().toUpperCase();
  if (ecc === 'ECDSA') return { kind: 'ECDSA' };
  if (ecc !== '') throw new AgentError('CONFIG_INVALID', `invalid ECC_SIGNATURE_ALGORITHM "${eccSignatureAlgorithm}" (want ECDSA or unset)`);
  if (![2048, 3072, 4096].includes(rsaBits)) throw new AgentError('CONFIG_INVALID', `invalid WORKLOAD_RSA_KEY_SIZE ${rsaBits} (want 2048, 3072 or 4096)`);
  return { kind: 'RSA', bits: rsaBits };
}

export function webcryptoAlgorithm(a: KeyAlgorithm): webcrypto.RsaHashedKeyGenParams | (webcrypto.EcKeyGenParams & { hash: string }) {
  return a.kind === 'ECDSA'
    ? { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' }
    : { name: 'RSASSA-PKCS1-v1_5', modulusLength: a.bits, publicExponent: new Uint8Array([1, 0, 1]), hash: 'SHA-256' };
}

export async function generateKeyAndCsr(o: { identity: string; algorithm: KeyAlgorithm; pkcs8?: boolean }): Promise<KeyAndCsr> {
  const alg = webcryptoAlgorithm(o.algorithm);
  const keys = (await webcrypto.subtle.generateKey(alg, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
  const csr = await x509().Pkcs10CertificateRequestGenerator.create({
    keys: keys as never,
    signingAlgorithm: alg,
    extensions: [new (x509().SubjectAlternativeNameExtension)([{ type: 'url', value: o.identity }], true)],
  });
  const key = KeyObject.from(keys.privateKey);
  const type = o.pkcs8 ? 'pkcs8' : o.algorithm.kind === 'ECDSA' ? 'sec1' : 'pkcs1';
  return { keyPem: key.export({ type, format: 'pem' }) as string, csrPem: csr.toString('pem') };
}

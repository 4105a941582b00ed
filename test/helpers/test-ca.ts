// A small CA for tests, written here independently of lib/ (its own use of @peculiar/x509): roots, intermediates
// and leaves signed from CSRs or fresh keys, with any validity window or SAN a test wants to lie about.

import 'reflect-metadata';
import { KeyObject, randomBytes, webcrypto } from 'node:crypto';
import * as x509 from '@peculiar/x509';

x509.cryptoProvider.set(webcrypto as never);

const ALG = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' };
const DAY = 86_400_000;

export interface Issuer {
  cert: x509.X509Certificate;
  keys: webcrypto.CryptoKeyPair;
  pem: string;
  keyPem: string;
}

const serial = () => randomBytes(9).toString('hex').replace(/^[89a-f]/, '1');

async function keyPair(): Promise<webcrypto.CryptoKeyPair> {
  return (await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
}

function keyPem(k: webcrypto.CryptoKey): string {
  return KeyObject.from(k).export({ type: 'pkcs8', format: 'pem' }) as string;
}

export async function makeRoot(name = 'test root', o: { notBefore?: Date; notAfter?: Date } = {}): Promise<Issuer> {
  const keys = await keyPair();
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: serial(), name: `CN=${name}, O=test`, keys: keys as never, signingAlgorithm: ALG,
    notBefore: o.notBefore ?? new Date(Date.now() - DAY), notAfter: o.notAfter ?? new Date(Date.now() + 365 * DAY),
    extensions: [new x509.BasicConstraintsExtension(true, undefined, true), new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true)],
  });
  return { cert, keys, pem: cert.toString('pem') + '\n', keyPem: keyPem(keys.privateKey) };
}

export async function makeIntermediate(parent: Issuer, name = 'test intermediate'): Promise<Issuer> {
  const keys = await keyPair();
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: serial(), subject: `CN=${name}, O=test`, issuer: parent.cert.subject, publicKey: keys.publicKey as never,
    signingKey: parent.keys.privateKey as never, signingAlgorithm: ALG,
    notBefore: new Date(Date.now() - DAY), notAfter: new Date(Date.now() + 300 * DAY),
    extensions: [new x509.BasicConstraintsExtension(true, 0, true), new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign, true)],
  });
  return { cert, keys, pem: cert.toString('pem') + '\n', keyPem: keyPem(keys.privateKey) };
}

export interface LeafOptions {
  /** URI SAN; default: the CSR's. */
  uri?: string;
  notBefore?: Date;
  notAfter?: Date;
  ttlMs?: number;
}

/** Signs a CSR (PEM) with the issuer; the SAN copied from the CSR unless o.uri says otherwise. */
export async function signCsr(issuer: Issuer, csrPem: string, o: LeafOptions = {}): Promise<string> {
  const csr = new x509.Pkcs10CertificateRequest(csrPem);
  if (!(await csr.verify())) throw new Error('CSR signature does not verify');
  const san = csr.extensions.find((e): e is x509.SubjectAlternativeNameExtension => e instanceof x509.SubjectAlternativeNameExtension);
  const uri = o.uri ?? san?.names.items.find((n) => n.type === 'url')?.value;
  const now = Date.now();
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: serial(), subject: '', issuer: issuer.cert.subject, publicKey: csr.publicKey,
    signingKey: issuer.keys.privateKey as never, signingAlgorithm: ALG,
    notBefore: o.notBefore ?? new Date(now - 60_000), notAfter: o.notAfter ?? new Date(now + (o.ttlMs ?? DAY)),
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature | x509.KeyUsageFlags.keyEncipherment, true),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth, x509.ExtendedKeyUsage.clientAuth]),
      ...(uri ? [new x509.SubjectAlternativeNameExtension([{ type: 'url', value: uri }], true)] : []),
    ],
  });
  return cert.toString('pem') + '\n';
}

/** A fresh key and a leaf for it: { certPem, keyPem } (server certificates for a test CA's TLS port, etc.). */
export async function makeLeaf(issuer: Issuer, o: LeafOptions & { dns?: string[]; ip?: string[] } = {}): Promise<{ certPem: string; keyPem: string }> {
  const keys = await keyPair();
  const now = Date.now();
  const names: x509.JsonGeneralName[] = [
    ...(o.uri ? [{ type: 'url' as const, value: o.uri }] : []),
    ...(o.dns ?? []).map((d) => ({ type: 'dns' as const, value: d })),
    ...(o.ip ?? []).map((d) => ({ type: 'ip' as const, value: d })),
  ];
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: serial(), subject: '', issuer: issuer.cert.subject, publicKey: keys.publicKey as never,
    signingKey: issuer.keys.privateKey as never, signingAlgorithm: ALG,
    notBefore: o.notBefore ?? new Date(now - 60_000), notAfter: o.notAfter ?? new Date(now + (o.ttlMs ?? DAY)),
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth, x509.ExtendedKeyUsage.clientAuth]),
      ...(names.length ? [new x509.SubjectAlternativeNameExtension(names, true)] : []),
    ],
  });
  return { certPem: cert.toString('pem') + '\n', keyPem: keyPem(keys.privateKey) };
}

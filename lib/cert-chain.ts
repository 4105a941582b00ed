// Checks on certificate chains before anything is handed to Envoy: the leaf matches our key, names the identity
// we asked for, every certificate is within its validity window and signed by the next, and the chain ends at
// a trusted root. Pure (the time is a parameter); failures are AgentErrors saying which check failed and where.

import { createPrivateKey, X509Certificate } from 'node:crypto';
import { AgentError, errorMessage } from './errors';

export interface CertInfo {
  /** URI SANs of the leaf (SPIFFE ids). */
  identities: string[];
  serial: string;
  notBefore: number;
  notAfter: number;
}

export interface CheckedChain {
  leaf: CertInfo;
  /** Leaf first, each issuer after it (PEM, newline-terminated). */
  chainPem: string;
  /** The trust bundle to give Envoy as ROOTCA. */
  rootPem: string;
}

const PEM_CERT = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

/** Every certificate in a PEM bundle; throws if there is none or one does not parse. */
export function parseCerts(pem: string, where: string): X509Certificate[] {
  const blocks = pem.match(PEM_CERT) ?? [];
  if (!blocks.length) throw new AgentError('BAD_INPUT', `${where}: no PEM certificate`);
  return blocks.map((b, i) => {
    try {
      return new X509Certificate(b);
    } catch (e) {
      throw new AgentError('BAD_INPUT', `${where}: certificate ${i + 1} does not parse: ${errorMessage(e)}`, e);
    }
  });
}

export function uriSans(c: X509Certificate): string[] {
  return (c.subjectAltName ?? '')
    .split(/,\s*/)
    .filter((s) => s.startsWith('URI:'))
    .map((s) => s.slice(4));
}

export function certInfo(c: X509Certificate): CertInfo {
  return {
    identities: uriSans(c),
    serial: c.serialNumber,
    notBefore: Date.parse(c.validFrom),
    notAfter: Date.parse(c.validTo),
  };
}

const pemOf = (c: X509Certificate) => (c.toString().endsWith('\n') ? c.toString() : `${c.toString()}\n`);

export interface ChainCheck {
  /** Leaf first; issuers after it; may end with the root. */
  chain: X509Certificate[];
  /** Roots the chain must end at (a root in the chain counts only if it is one of these, or if rootsFromChain). */
  roots: X509Certificate[];
  keyPem: string;
  /** The SPIFFE id the leaf must carry; unset for file-mounted certificates (whatever identity they hold). */
  identity?: string;
  now: number;
  where: string;
}

export function checkChain(o: ChainCheck): CheckedChain {
  const { chain, where } = o;
  if (!chain.length) throw new AgentError('BAD_INPUT', `${where}: empty certificate chain`);
  const leaf = chain[0]!;
  checkKeyPair(leaf, o.keyPem, where);
  const ids = uriSans(leaf);
  if (o.identity !== undefined && !ids.includes(o.identity)) {
    throw new AgentError(
      'BAD_INPUT',
      `${where}: the leaf certificate is for ${ids.join(', ') || 'no URI SAN'}, not ${o.identity}`,
    );
  }
  chain.forEach((c, i) =>
    checkValidity(c, o.now, where, i === 0 ? 'the leaf certificate' : `certificate ${i + 1} of the chain`),
  );
  for (let i = 0; i + 1 < chain.length; i++) {
    if (!signedBy(chain[i]!, chain[i + 1]!)) {
      throw new AgentError(
        'BAD_INPUT',
        `${where}: certificate ${i + 1} of the chain (serial ${chain[i]!.serialNumber}) is not signed by certificate ${i + 2}`,
      );
    }
  }
  if (!o.roots.length) throw new AgentError('BAD_INPUT', `${where}: no root certificate to verify the chain against`);
  const last = chain[chain.length - 1]!;
  const root =
    o.roots.find((r) => r.fingerprint256 === last.fingerprint256 && signedBy(last, r)) ??
    o.roots.find((r) => signedBy(last, r));
  if (!root)
    throw new AgentError(
      'BAD_INPUT',
      `${where}: the chain does not verify to the root (${o.roots.map((r) => r.subject.replace(/\n/g, ',')).join('; ')})`,
    );
  const chainCerts = root.fingerprint256 === last.fingerprint256 && chain.length > 1 ? chain.slice(0, -1) : chain;
  return { leaf: certInfo(leaf), chainPem: chainCerts.map(pemOf).join(''), rootPem: o.roots.map(pemOf).join('') };
}

/** The certificate is for this private key. */
export function checkKeyPair(leaf: X509Certificate, keyPem: string, where: string): void {
  let key;
  try {
    key = createPrivateKey(keyPem);
  } catch (e) {
    throw new AgentError('BAD_INPUT', `${where}: private key does not parse: ${errorMessage(e)}`, e);
  }
  if (!leaf.checkPrivateKey(key))
    throw new AgentError(
      'BAD_INPUT',
      `${where}: the leaf certificate (serial ${leaf.serialNumber}) is not for our private key`,
    );
}

export function checkValidity(c: X509Certificate, now: number, where: string, what = 'the certificate'): void {
  const nb = Date.parse(c.validFrom);
  const na = Date.parse(c.validTo);
  if (now < nb)
    throw new AgentError(
      'BAD_INPUT',
      `${where}: ${what} (serial ${c.serialNumber}) is not valid before ${new Date(nb).toISOString()}`,
    );
  if (now > na)
    throw new AgentError(
      'BAD_INPUT',
      `${where}: ${what} (serial ${c.serialNumber}) expired at ${new Date(na).toISOString()}`,
    );
}

function signedBy(c: X509Certificate, issuer: X509Certificate): boolean {
  try {
    return c.checkIssued(issuer) && c.verify(issuer.publicKey);
  } catch {
    return false;
  }
}

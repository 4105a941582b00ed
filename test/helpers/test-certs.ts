// Named test certificates from the tests' own CA (./test-ca.ts), made at test time and also written to files (no
// private key is committed): self-signed CAs, and leaves signed by one of them with DNS names.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { type Issuer, makeLeaf, makeRoot } from './test-ca';

export interface CertSpec {
  /** The CA that signs it; none makes a self-signed CA. */
  ca?: string;
  /** DNS names (subjectAltName). */
  hosts?: string[];
}

export interface TestCert {
  cert: string;
  key: string;
  certPath: string;
  keyPath: string;
}

export async function makeCerts(dir: string, specs: Record<string, CertSpec>): Promise<Record<string, TestCert>> {
  const out: Record<string, TestCert> = {};
  const issuers = new Map<string, Issuer>();
  const names = Object.keys(specs);
  // CAs first, then anything whose CA is already made.
  while (Object.keys(out).length < names.length) {
    const before = Object.keys(out).length;
    for (const name of names) {
      const s = specs[name] ?? {};
      if (out[name] || (s.ca && !issuers.has(s.ca))) continue;
      let cert: string;
      let key: string;
      if (!s.ca) {
        const root = await makeRoot(name);
        issuers.set(name, root);
        [cert, key] = [root.pem, root.keyPem];
      } else {
        const leaf = await makeLeaf(issuers.get(s.ca)!, { dns: s.hosts ?? [name] });
        [cert, key] = [leaf.certPem, leaf.keyPem];
      }
      const certPath = path.join(dir, `${name}.crt`);
      const keyPath = path.join(dir, `${name}.key`);
      fs.writeFileSync(certPath, cert);
      fs.writeFileSync(keyPath, key, { mode: 0o600 });
      out[name] = { cert, key, certPath, keyPath };
    }
    if (Object.keys(out).length === before) throw new Error(`test certificates: unknown or circular CA in ${JSON.stringify(specs)}`);
  }
  return out;
}

// Test certificates made with the openssl CLI at test time (no private key is committed): CAs, and leaves signed
// by one of them with DNS subject alternative names, valid for a day. Everything is written under `dir`.

import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';

export interface CertSpec {
  /** The CA that signs it; none makes a self-signed CA. */
  ca?: string;
  /** DNS names (subjectAltName); the first is the CN too. */
  hosts?: string[];
}

export interface TestCert {
  cert: string;
  key: string;
  certPath: string;
  keyPath: string;
}

export function makeCerts(dir: string, specs: Record<string, CertSpec>): Record<string, TestCert> {
  const out: Record<string, TestCert> = {};
  const openssl = (args: string[]) => execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  const names = Object.keys(specs);
  // CAs first, then anything whose CA is already made.
  while (Object.keys(out).length < names.length) {
    const before = Object.keys(out).length;
    for (const name of names) {
      const s = specs[name] ?? {};
      if (out[name] || (s.ca && !out[s.ca])) continue;
      const certPath = path.join(dir, `${name}.crt`);
      const keyPath = path.join(dir, `${name}.key`);
      const cn = s.hosts?.[0] ?? name;
      const key = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', keyPath];
      if (!s.ca) {
        openssl(['req', '-x509', ...key, '-out', certPath, '-days', '1', '-subj', `/CN=${cn}`,
          '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign']);
      } else {
        const csr = path.join(dir, `${name}.csr`);
        const ext = path.join(dir, `${name}.ext`);
        fs.writeFileSync(ext, `subjectAltName=${(s.hosts ?? [name]).map((h) => `DNS:${h}`).join(',')}\nextendedKeyUsage=serverAuth,clientAuth\n`);
        openssl(['req', ...key, '-out', csr, '-subj', `/CN=${cn}`]);
        openssl(['x509', '-req', '-in', csr, '-CA', out[s.ca]!.certPath, '-CAkey', out[s.ca]!.keyPath, '-CAcreateserial', '-days', '1', '-out', certPath, '-extfile', ext]);
      }
      out[name] = { cert: fs.readFileSync(certPath, 'utf8'), key: fs.readFileSync(keyPath, 'utf8'), certPath, keyPath };
    }
    if (Object.keys(out).length === before) throw new Error(`test certificates: unknown or circular CA in ${JSON.stringify(specs)}`);
  }
  return out;
}

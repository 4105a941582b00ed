// The one way into @peculiar/x509 (X.509 certificates and PKCS#10 CSRs built from typed ASN.1 schemas on Node's
// WebCrypto): it needs the Reflect metadata API loaded before it and a crypto provider set, once. Loaded on first
// use, not at start-up: setting up its schemas costs more CPU than everything else the agent does before Envoy's
// spawn, and a proxy first needs a CSR only when Envoy asks for a certificate.

import { webcrypto } from 'node:crypto';
import type * as X509 from '@peculiar/x509';

let loaded: typeof X509 | undefined;

export function x509(): typeof X509 {
  if (!loaded) {
    /* eslint-disable @typescript-eslint/no-require-imports */
    require('reflect-metadata');
    const m = require('@peculiar/x509') as typeof X509;
    /* eslint-enable @typescript-eslint/no-require-imports */
    m.cryptoProvider.set(webcrypto as never);
    loaded = m;
  }
  return loaded;
}

export type { X509 };

// The one way into @peculiar/x509 (X.509 certificates and PKCS#10 CSRs built from typed ASN.1 schemas on Node's
// WebCrypto): it needs the Reflect metadata API loaded before it and a crypto provider set, once.

import 'reflect-metadata';
import { webcrypto } from 'node:crypto';
import * as x509 from '@peculiar/x509';

x509.cryptoProvider.set(webcrypto as never);

export { x509 };

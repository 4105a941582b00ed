// The client certificate the agent's own TLS clients present: PROV_CERT's cert-chain.pem and key.pem (to the CA and
// to the discovery server, Go's GetKeyCertsForCA / GetKeyCertsForXDS), or the mounted files that
// ISTIO_META_TLS_CLIENT_* name (discovery server only). Read at each connect, so a renewed provisioning certificate
// (OUTPUT_CERTS writing into PROV_CERT, Istio's VM setup) is presented from the next connect on. As Go's
// GetClientCertificate (pilot/pkg/grpc/tls.go): a chain that cannot be read, does not parse or has expired presents
// none, and the token alone is tried; a usable chain whose key cannot be read fails the connect.

import * as path from 'node:path';
import { X509Certificate } from 'node:crypto';
import { AgentError, errorMessage } from './errors';
import { scope } from './log';
import { readNamedFileSync } from './named-file';

const log = scope('tls');

export interface ClientCertFiles {
  cert: string;
  key: string;
}

export interface ClientCert {
  cert: Buffer;
  key: Buffer;
}

/** PROV_CERT's layout (Istio's constants CertChainFilename, KeyFilename). */
export function provCertFiles(dir: string): ClientCertFiles {
  return { cert: path.join(dir, 'cert-chain.pem'), key: path.join(dir, 'key.pem') };
}

let lastSkipped = '';

function skip(file: string, why: string): undefined {
  const line = `client certificate ${file} not presented (${why}); the token alone is sent`;
  // Once per change: a VM without its provisioning certificate connects every few seconds.
  if (line !== lastSkipped) log.warn(line);
  lastSkipped = line;
  return undefined;
}

/** The key and chain to present, or undefined for none. Throws AgentError('IO') when only the key is unreadable. */
export function loadClientCert(files: ClientCertFiles | undefined, now: number = Date.now()): ClientCert | undefined {
  if (!files) return undefined;
  let cert: Buffer;
  try {
    cert = readNamedFileSync(files.cert);
  } catch (e) {
    const code = ((e as Error).cause as NodeJS.ErrnoException | undefined)?.code;
    return code === 'ENOENT' ? undefined : skip(files.cert, errorMessage(e));
  }
  try {
    if (Date.parse(new X509Certificate(cert).validTo) < now) return skip(files.cert, 'expired');
  } catch (e) {
    return skip(files.cert, `does not parse: ${errorMessage(e)}`);
  }
  let key: Buffer;
  try {
    key = readNamedFileSync(files.key);
  } catch (e) {
    throw new AgentError('IO', `cannot read the client key ${files.key}: ${errorMessage(e)}`, e);
  }
  lastSkipped = '';
  return { cert, key };
}

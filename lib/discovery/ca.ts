// The embedded CA of standalone mode: Istio's CreateCertificate, served beside ADS by the discovery server, so
// sidecars get workload certificates with no istiod. Layout, under the config directory:
//
//   ca/root-cert.pem, ca/root-key.pem   the mesh root, created on first start (key 0600) and reused after; hosts
//                                       that share the config directory share the root, so their sidecars
//                                       trust each other
//   ca/identities/<namespace>/<sa>      one file per identity the CA may sign: its bootstrap token, owner-only
//                                       like the root key (./identities.ts)
//
// A caller proves who it is with `authorization: Bearer <token>`: the token must equal an identity's file, and
// the CSR must ask for exactly that identity (spiffe://<trust domain>/ns/<namespace>/sa/<sa>). Nothing is signed
// without a token, and the CA is only served on a Unix socket or a loopback address (the discovery port is
// plaintext, so a token must not cross the network).

import { createPrivateKey, KeyObject, randomBytes, webcrypto } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { CA_SERVICE_DEFINITION, type CertificateRequest, type CertificateResponse } from '../ca-protos';
import { spiffeId } from '../csr';
import { AgentError, errorMessage } from '../errors';
import { writeFileAtomic } from '../fs-atomic';
import { TokenIdentities } from './identities';
import { scope } from '../log';
import { x509, type X509 } from '../x509';

const log = scope('ca');

const ALG = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' };
const DAY = 86_400_000;
const ROOT_LIFETIME_MS = 10 * 365 * DAY;
const DEFAULT_MAX_TTL_MS = 90 * DAY;
const DEFAULT_TTL_MS = DAY;
// Tolerates clocks a little behind ours.
const BACKDATE_MS = 60_000;

export interface EmbeddedCaOptions {
  /** The `ca` directory (root and identities). */
  dir: string;
  trustDomain: string;
  maxTtlMs?: number;
  now?: () => number;
}

export interface CaStats {
  signed: number;
  refused: number;
}

/** Is the CA's directory there (identities declared)? The discovery server serves the CA only then. */
export function caDeclared(configDir: string): boolean {
  return fs.existsSync(path.join(configDir, 'ca', 'identities'));
}

export class EmbeddedCa {
  readonly stats: CaStats = { signed: 0, refused: 0 };
  private readonly now: () => number;

  private constructor(
    private readonly o: EmbeddedCaOptions,
    private readonly root: X509.X509Certificate,
    private readonly rootKey: webcrypto.CryptoKey,
    readonly rootPem: string,
    /** The token files; the ADS server authenticates proxies with the same ones. */
    readonly identities: TokenIdentities,
  ) {
    this.now = o.now ?? Date.now;
  }

  get rootSerial(): string {
    return this.root.serialNumber;
  }

  /** Loads the root, or creates it when there is none (one process wins if several start at once). */
  static async open(o: EmbeddedCaOptions): Promise<EmbeddedCa> {
    const X = x509();
    // Token files first: a loose one is a start-up error naming it, before anything is created.
    const identities = new TokenIdentities(path.join(o.dir, 'identities'));
    identities.check();
    const certFile = path.join(o.dir, 'root-cert.pem');
    const keyFile = path.join(o.dir, 'root-key.pem');
    fs.mkdirSync(o.dir, { recursive: true, mode: 0o700 });
    if (!fs.existsSync(certFile)) await createRoot(o, certFile, keyFile);
    let certPem: string;
    let keyPem: string;
    try {
      certPem = fs.readFileSync(certFile, 'utf8');
      keyPem = fs.readFileSync(keyFile, 'utf8');
    } catch (e) {
      throw new AgentError('IO', `embedded CA: cannot read its root (${certFile}, ${keyFile}): ${errorMessage(e)}`, e);
    }
    const mode = fs.statSync(keyFile).mode & 0o077;
    if (mode)
      throw new AgentError(
        'CONFIG_INVALID',
        `embedded CA: ${keyFile} is readable by group or others (mode ${(fs.statSync(keyFile).mode & 0o777).toString(8)}); want 0600`,
      );
    let root: X509.X509Certificate;
    let key: webcrypto.CryptoKey;
    try {
      root = new X.X509Certificate(certPem);
      const der = createPrivateKey(keyPem).export({ type: 'pkcs8', format: 'der' });
      key = await webcrypto.subtle.importKey('pkcs8', der, ALG, false, ['sign']);
    } catch (e) {
      throw new AgentError('CONFIG_INVALID', `embedded CA: root in ${o.dir} does not load: ${errorMessage(e)}`, e);
    }
    log.info(`embedded CA: root ${root.serialNumber} from ${certFile}, valid until ${root.notAfter.toISOString()}`);
    return new EmbeddedCa(o, root, key, certPem.endsWith('\n') ? certPem : `${certPem}\n`, identities);
  }

  /** Signs the CSR for the identity the token proves; AgentError (code BAD_INPUT) with the reason otherwise. */
  async sign(req: CertificateRequest, token: string | undefined): Promise<string[]> {
    const X = x509();
    if (!token)
      throw new AgentError(
        'BAD_INPUT',
        'no bearer token: a caller proves its identity with the token file of that identity',
      );
    const who = this.identities.identityForToken(token);
    if (!who) throw new AgentError('BAD_INPUT', 'the token matches no identity under ca/identities');
    const id = spiffeId(this.o.trustDomain, who.namespace, who.serviceAccount);
    let csr: X509.Pkcs10CertificateRequest;
    try {
      csr = new X.Pkcs10CertificateRequest(req.csr);
    } catch (e) {
      throw new AgentError('BAD_INPUT', `the CSR does not parse: ${errorMessage(e)}`, e);
    }
    if (!(await csr.verify())) throw new AgentError('BAD_INPUT', 'the CSR signature does not verify');
    const san = csr.extensions.find(
      (e): e is X509.SubjectAlternativeNameExtension => e instanceof X.SubjectAlternativeNameExtension,
    );
    const uris = san?.names.items.filter((n) => n.type === 'url').map((n) => n.value) ?? [];
    if (uris.length !== 1 || uris[0] !== id)
      throw new AgentError('BAD_INPUT', `the token is for ${id}; the CSR asks for ${uris.join(', ') || 'no URI SAN'}`);
    const ttl = Math.min(
      req.validityDuration > 0 ? req.validityDuration * 1000 : DEFAULT_TTL_MS,
      this.o.maxTtlMs ?? DEFAULT_MAX_TTL_MS,
    );
    const now = this.now();
    const notAfter = Math.min(now + ttl, this.root.notAfter.getTime());
    const leaf = await X.X509CertificateGenerator.create({
      serialNumber: serialNumber(),
      subject: '',
      issuer: this.root.subject,
      publicKey: csr.publicKey,
      signingKey: this.rootKey as never,
      signingAlgorithm: ALG,
      notBefore: new Date(Math.floor((now - BACKDATE_MS) / 1000) * 1000),
      notAfter: new Date(Math.floor(notAfter / 1000) * 1000),
      extensions: [
        new X.BasicConstraintsExtension(false, undefined, true),
        new X.KeyUsagesExtension(X.KeyUsageFlags.digitalSignature | X.KeyUsageFlags.keyEncipherment, true),
        new X.ExtendedKeyUsageExtension([X.ExtendedKeyUsage.serverAuth, X.ExtendedKeyUsage.clientAuth]),
        // Critical: the subject is empty, so the SAN is the certificate's only name (RFC 5280 4.2.1.6).
        new X.SubjectAlternativeNameExtension([{ type: 'url', value: id }], true),
        await X.AuthorityKeyIdentifierExtension.create(this.root, false),
      ],
    });
    this.stats.signed++;
    log.info(`embedded CA: signed ${id}, serial ${leaf.serialNumber}, until ${leaf.notAfter.toISOString()}`);
    return [`${leaf.toString('pem')}\n`, this.rootPem];
  }

  /** The gRPC service (add it to a server that listens only locally). */
  service(): { definition: grpc.ServiceDefinition; implementation: grpc.UntypedServiceImplementation } {
    return {
      definition: CA_SERVICE_DEFINITION,
      implementation: {
        CreateCertificate: (
          call: grpc.ServerUnaryCall<CertificateRequest, CertificateResponse>,
          cb: grpc.sendUnaryData<CertificateResponse>,
        ) => {
          const auth = String(call.metadata.get('authorization')[0] ?? '');
          const token = /^Bearer\s+(.+)$/i.exec(auth)?.[1]?.trim();
          this.sign(call.request, token).then(
            (certChain) => cb(null, { certChain }),
            (e) => {
              this.stats.refused++;
              log.warn(`embedded CA: refused a certificate request: ${errorMessage(e)}`);
              const code = !token
                ? grpc.status.UNAUTHENTICATED
                : /matches no identity/.test(errorMessage(e))
                  ? grpc.status.UNAUTHENTICATED
                  : grpc.status.PERMISSION_DENIED;
              cb({ code, details: errorMessage(e) });
            },
          );
        },
      },
    };
  }
}

function serialNumber(): string {
  const b = randomBytes(16);
  b[0]! &= 0x7f; // positive
  b[0]! |= 0x01; // and not starting with a zero byte
  return b.toString('hex');
}

async function createRoot(o: EmbeddedCaOptions, certFile: string, keyFile: string): Promise<void> {
  const X = x509();
  const lock = path.join(o.dir, '.creating');
  try {
    fs.mkdirSync(lock);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EEXIST')
      throw new AgentError('IO', `embedded CA: cannot create ${lock}: ${errorMessage(e)}`, e);
    // Another process is creating the root: wait for it.
    const deadline = Date.now() + 10_000;
    while (!(fs.existsSync(certFile) && fs.existsSync(keyFile))) {
      if (Date.now() > deadline)
        throw new AgentError(
          'TIMEOUT',
          `embedded CA: another process has been creating the root in ${o.dir} for 10 s (remove ${lock} if it died)`,
        );
      await new Promise((r) => setTimeout(r, 50));
    }
    return;
  }
  try {
    if (fs.existsSync(certFile)) return; // created between our check and the lock
    if (fs.existsSync(keyFile))
      throw new AgentError(
        'CONFIG_INVALID',
        `embedded CA: ${keyFile} exists without ${certFile}; restore the certificate or remove the key to make a new root`,
      );
    const keys = (await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
    const now = o.now?.() ?? Date.now();
    const cert = await X.X509CertificateGenerator.createSelfSigned({
      serialNumber: serialNumber(),
      name: `O=${o.trustDomain.replace(/[,=+<>#;\\"]/g, '_')}, CN=pilot-agent standalone root`,
      keys: keys as never,
      signingAlgorithm: ALG,
      notBefore: new Date(now - BACKDATE_MS),
      notAfter: new Date(now + ROOT_LIFETIME_MS),
      extensions: [
        new X.BasicConstraintsExtension(true, undefined, true),
        new X.KeyUsagesExtension(
          X.KeyUsageFlags.keyCertSign | X.KeyUsageFlags.cRLSign | X.KeyUsageFlags.digitalSignature,
          true,
        ),
        await X.SubjectKeyIdentifierExtension.create(keys.publicKey as never),
      ],
    });
    const keyPem = KeyObject.from(keys.privateKey).export({ type: 'pkcs8', format: 'pem' }) as string;
    // The key first: a root certificate without its key must never be seen as complete.
    writeFileAtomic(keyFile, keyPem, 0o600);
    writeFileAtomic(certFile, `${cert.toString('pem')}\n`, 0o644);
    log.info(`embedded CA: created a new root in ${o.dir}`);
  } finally {
    fs.rmSync(lock, { recursive: true, force: true });
  }
}

// The workload's secrets: one certificate and key (`default`) with its trust bundle (`ROOTCA`), plus the files
// Envoy names itself (`file-cert:<cert>~<key>`, `file-root:<path>`, `file-root:system`). It is the SDS server's
// SecretProvider; onUpdate(name) tells the SDS server to push.
//
// Where `default` comes from, in Istio's order: the workload-spiffe-credentials directory, else the mounted
// ./etc/certs files (FILE_MOUNTED_CERTS, or cert-chain.pem and key.pem present), else a CA (CSR -> signer).
// From a CA, the certificate is renewed at expiry - lifetime x (grace ratio +- jitter); a CA that fails is
// retried with backoff while the current certificate stays in use. Mounted files are watched (directories,
// so Kubernetes' `..data` symlink swap is seen), debounced, and taken only when they parse, the key matches and
// the chain verifies: a half-written file is refused and retried, the last good secret stays.
//
// Every refused certificate (CA answer or file) gives one log line naming what and where, and a metric. The
// private key never leaves the process except into OUTPUT_CERTS (atomic writes, 0600) and, over SDS, to Envoy.
//
// `ROOTCA` is, as in Istio's SecretManagerClient, the workload's roots united with the roots the control plane
// pushes in ProxyConfig.caCertificatesPem (PCDS, for root migration: deduplicated, sorted), and carries the
// plugged-in CA's CRL (PILOT_ENABLE_CA_CRL) while its file exists; the file is watched and each change pushed.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { Counter, Gauge, type Registry } from './prom';
import { caAnswered, caRetryDelay, type CertificateSigner } from './ca-client';
import { checkChain, checkKeyPair, checkValidity, parseCerts, type CertInfo } from './cert-chain';
import { X509Certificate } from 'node:crypto';
import { closedSignal, type Component, type Condition, type StatusRoute } from './component';
import { generateKeyAndCsr, keyAndCsrNow, type KeyAlgorithm } from './csr';
import { AgentError, errorMessage } from './errors';
import { FileWatcher } from './file-watcher';
import { readNamedFile, readNamedFileSync, socketReader, type Reader } from './named-file';
import { writeFileAtomic } from './fs-atomic';
import { scope } from './log';
import { ROOT_SECRET, WORKLOAD_SECRET, type SecretProvider, type SecretValue } from './sds-server';
import { parseSecretName } from './secret-names';
import { json } from './status-server';

const log = scope('cache');

export const MOUNTED_CERTS_DIR = './etc/certs';
export const CREDENTIALS_DIR = './var/run/secrets/workload-spiffe-credentials';
const CERT_CHAIN = 'cert-chain.pem';
const KEY = 'key.pem';
const ROOT_CERT = 'root-cert.pem';
const SYSTEM_BUNDLES = [
  '/etc/ssl/certs/ca-certificates.crt',
  '/etc/pki/tls/certs/ca-bundle.crt',
  '/etc/ssl/ca-bundle.pem',
  '/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem',
  '/etc/ssl/cert.pem',
];
// How long a file that does not check out (e.g. half written) is re-read before waiting for the next change.
const FILE_RETRY_MS = 500;
const FILE_RETRY_FOR_MS = 10_000;

export interface SecretCacheOptions {
  /** spiffe://<td>/ns/<ns>/sa/<sa>: what a CA-issued certificate must name. */
  identity: string;
  algorithm: KeyAlgorithm;
  pkcs8?: boolean;
  /** Requested lifetime (SECRET_TTL). */
  ttlMs: number;
  graceRatio: number;
  graceJitter: number;
  /** Issues the workload certificate unless files are mounted. */
  signer?: CertificateSigner;
  /** Directory holding cert-chain.pem, key.pem, root-cert.pem to use instead of a CA (see mountedCertsDir()). */
  mountedDir?: string;
  /** OUTPUT_CERTS: where issued certificates and the key are written. */
  outputDir?: string;
  /** Their mode (default 0600); 0644 also makes a directory the agent creates 0755. */
  outputMode?: number;
  debounceMs?: number;
  /** CA retry backoff (default 1 s doubling to 60 s, jittered). */
  backoff?: { initialMs: number; maxMs: number };
  /** Ask the CA only once a stream asks for `default` or `ROOTCA` (Istio's behaviour); until then ready. */
  lazy?: boolean;
  /**
   * With `lazy`: still ask the CA at start (the Go agent pre-generates the workload certificate, so Envoy's first
   * request finds it); readiness waits for it only once Envoy asks.
   */
  prefetch?: boolean;
  /**
   * The SDS socket: files behind `file-cert:`/`file-root:` names are served only if whoever can connect to it could
   * read them itself (lib/named-file.ts socketReader). Without it, files are read with the agent's own rights.
   */
  sdsSocket?: string;
  /** The plugged-in CA's CRL (Istio's /var/run/secrets/istio/crl/ca-crl.pem): put into ROOTCA while it exists. */
  crlFile?: string;
  now?: () => number;
  random?: () => number;
}

/**
 * The mounted-certificate directory to use, if any (credentials directory first, then ./etc/certs). Not
 * ./etc/certs when OUTPUT_CERTS writes there (Istio's VM default): those are this agent's own issued files, and
 * reading them back would stop rotation (Go's outputToCertificatePath).
 */
export function mountedCertsDir(
  fileMountedCerts: boolean,
  exists: (p: string) => boolean = fs.existsSync,
  outputDir = '',
): string | undefined {
  if (exists(path.join(CREDENTIALS_DIR, CERT_CHAIN)) && exists(path.join(CREDENTIALS_DIR, KEY))) return CREDENTIALS_DIR;
  if (fileMountedCerts) return MOUNTED_CERTS_DIR;
  if (outputDir && path.resolve(outputDir) === path.resolve(MOUNTED_CERTS_DIR)) return undefined;
  if (exists(path.join(MOUNTED_CERTS_DIR, CERT_CHAIN)) && exists(path.join(MOUNTED_CERTS_DIR, KEY)))
    return MOUNTED_CERTS_DIR;
  return undefined;
}

/**
 * When to renew a certificate received at `issuedAt`: expiry - lifetime x (ratio +- jitter), the lifetime counted
 * from issuance, as Istio's agent does (rotateTime: ExpireTime - CreatedTime, CreatedTime being when it arrived).
 * Not from notBefore: istiod backdates it by 2 minutes against clock skew, which made a 150 s certificate be
 * renewed after 15 s instead of 75 s.
 */
export function rotationTime(
  leaf: Pick<CertInfo, 'notAfter'>,
  ratio: number,
  jitter: number,
  rand: () => number,
  issuedAt: number,
): number {
  const lifetime = Math.max(0, leaf.notAfter - issuedAt);
  const r = Math.min(1, Math.max(0, ratio + jitter * (rand() * 2 - 1)));
  return issuedAt + lifetime * (1 - r);
}

interface Workload {
  chainPem: string;
  keyPem: string;
  rootPem: string;
  leaf: CertInfo;
  source: string;
}

interface FileSecret {
  name: string;
  files: string[];
  value?: SecretValue;
  error?: string;
  /** A read is under way; `again`: a change came during it, read once more after. */
  loading: boolean;
  again: boolean;
}

type FailureReason = 'ca_unreachable' | 'ca_refused' | 'bad_chain' | 'bad_file' | 'credentials' | 'output';

const PEM_CRL = /-----BEGIN X509 CRL-----[\s\S]+?-----END X509 CRL-----/g;

/**
 * The workload's roots united with the control plane's (Istio's mergeConfigTrustBundle): each certificate once
 * (compared by DER), sorted by PEM text as Go sorts them. `extra` is already normalised (configTrustBundle()).
 */
export function mergeRoots(rootPem: string, extra: readonly string[]): string {
  if (!extra.length) return rootPem;
  const all = new Set<string>(extra);
  for (const c of rootPem.match(PEM_CERT) ?? []) all.add(normalPem(c));
  return [...all].sort().join('');
}

function normalPem(block: string): string {
  const t = new X509Certificate(block).toString();
  return t.endsWith('\n') ? t : `${t}\n`;
}

/** ProxyConfig.caCertificatesPem as pushed: every certificate must parse (else the push is refused, naming which). */
export function configTrustBundle(pems: readonly string[]): string[] {
  const out = new Set<string>();
  pems.forEach((p, i) => {
    for (const c of parseCerts(p, `ProxyConfig.caCertificatesPem[${i}]`)) out.add(normalPem(c.toString()));
  });
  return [...out].sort();
}

export class SecretCache implements Component, SecretProvider {
  readonly name = 'secret cache';
  readonly closed: Promise<Error | undefined>;
  private readonly signal = closedSignal();
  private workload: Workload | undefined;
  /** Roots pushed by the control plane (PCDS), normalised and sorted. */
  private extraRoots: string[] = [];
  /** The CRL's PEM while its file exists and holds one; `crlError`: the last read that failed. */
  private crlPem: string | undefined;
  private crlError = '';
  private readonly fileSecrets = new Map<string, FileSecret>();
  /** Watched file -> the file secrets reading it. */
  private readonly fileUsers = new Map<string, Set<FileSecret>>();
  /** File secrets whose last read failed, read again shortly (a half-written file). */
  private readonly failing = new Set<FileSecret>();
  private readonly listeners: ((name: string) => void)[] = [];
  private rotateTimer: NodeJS.Timeout | undefined;
  private fileRetryTimer: NodeJS.Timeout | undefined;
  private watcher: FileWatcher | undefined;
  private nextRotation: number | undefined;
  private attempt = 0;
  private fetching = false;
  private wanted: boolean;
  private fileRetryUntil: number | undefined;
  /** The last failure logged, so a retry meeting the same one does not log it again. */
  private lastFailure = '';
  private state: 'new' | 'running' | 'closed' = 'new';
  private readonly ca = { lastSuccess: 0, lastFailure: 0, lastError: '', reachable: undefined as boolean | undefined };
  private readonly counts = { issued: 0, rotated: 0, failed: new Map<FailureReason, number>() };
  /** Reads of certificate files (file-cert:, file-root:, mounted) that failed: Go's num_file_secret_failures_total. */
  private fileSecretFailures = 0;
  private readonly now: () => number;
  private readonly rand: () => number;

  constructor(private readonly o: SecretCacheOptions) {
    this.closed = this.signal.closed;
    this.now = o.now ?? Date.now;
    this.rand = o.random ?? Math.random;
    this.wanted = !o.lazy;
    // Neither: only the certificate files the config names (file-cert:, file-root:) are served (standalone, no CA).
  }

  /** Called with the secret's name whenever a secret changes (or first exists). */
  onUpdate(fn: (name: string) => void): void {
    this.listeners.push(fn);
  }

  /**
   * Starts getting the first certificate (does not wait for it: see readiness()). A second call does nothing: the
   * agent starts the cache just after Envoy's spawn, before its other components load, so that the CA's answer
   * overlaps Envoy's start; the components' start then meets a running cache.
   */
  async start(): Promise<void> {
    if (this.state === 'running') return;
    if (this.state !== 'new') throw new AgentError('INTERNAL', 'secret cache already closed');
    this.state = 'running';
    const debounceMs = this.o.debounceMs ?? 100;
    this.watcher = new FileWatcher((changed) => this.filesChanged(changed), { debounceMs, pollMs: 2000 });
    if (this.o.mountedDir) {
      log.info(`workload certificate from mounted files in ${this.o.mountedDir}`);
      this.loadMounted();
    } else if (this.o.signer) {
      const when = this.wanted ? '' : this.o.prefetch ? ', asked for at start' : ', once Envoy asks for it';
      log.info(`workload certificate for ${this.o.identity} from CA ${this.o.signer.address}${when}`);
      if (this.wanted || this.o.prefetch) void this.fetch();
    } else {
      log.info(
        'no CA and no mounted certificates: serving only the certificate files the config names, no workload certificate',
      );
    }
    for (const p of this.mountedFiles) this.watcher.add({ path: p, mode: 'content' });
    if (this.o.crlFile) {
      this.watcher.add({ path: this.o.crlFile, mode: 'content' });
      this.loadCrl();
    }
    for (const f of this.fileSecrets.values()) this.startFileSecret(f);
  }

  async close(): Promise<void> {
    if (this.state === 'closed') return;
    this.state = 'closed';
    if (this.rotateTimer) clearTimeout(this.rotateTimer);
    if (this.fileRetryTimer) clearTimeout(this.fileRetryTimer);
    this.watcher?.close();
    this.signal.resolve(undefined);
  }

  // ---- SecretProvider ----

  secret(name: string): SecretValue | undefined {
    if (name === WORKLOAD_SECRET)
      return this.workload && { kind: 'tls', certChainPem: this.workload.chainPem, keyPem: this.workload.keyPem };
    if (name === ROOT_SECRET) {
      if (!this.workload) return undefined;
      const rootPem = mergeRoots(this.workload.rootPem, this.extraRoots);
      return this.crlPem ? { kind: 'root', rootPem, crlPem: this.crlPem } : { kind: 'root', rootPem };
    }
    return this.fileSecrets.get(name)?.value;
  }

  /**
   * The roots the control plane pushed (ProxyConfig.caCertificatesPem, PCDS), as Istio's UpdateConfigTrustBundle:
   * throws (the push is NACKed) if one does not parse; a change is pushed as ROOTCA and, with a CA, the workload
   * certificate is renewed as Go does. An empty list removes the pushed roots.
   */
  setConfigTrustBundle(pems: readonly string[]): void {
    const next = configTrustBundle(pems);
    if (next.join('') === this.extraRoots.join('')) return;
    this.extraRoots = next;
    log.info(`trust bundle from the control plane: ${next.length} root(s) added to ${ROOT_SECRET}`);
    if (!this.workload) return;
    this.emit(ROOT_SECRET);
    if (this.o.signer && this.state === 'running') this.scheduleRotation(this.now());
  }

  /** The SDS server admitted this name (see lib/sds-server.ts): a file name is read, then watched. */
  requested(name: string): void {
    if (name !== WORKLOAD_SECRET && name !== ROOT_SECRET) {
      this.addFileSecret(name);
    } else if (!this.wanted) {
      this.wanted = true;
      // Prefetched already (or on its way): Envoy gets that one, not a second certificate.
      if (this.o.signer && this.state === 'running' && !this.workload) void this.fetch();
    }
  }

  /** No stream holds the name any more: its files are no longer watched, and it is forgotten. */
  released(name: string): void {
    const f = this.fileSecrets.get(name);
    if (!f) return;
    this.fileSecrets.delete(name);
    this.failing.delete(f);
    for (const file of f.files) {
      const users = this.fileUsers.get(file);
      users?.delete(f);
      if (users && !users.size) this.fileUsers.delete(file);
      this.watcher?.remove(file);
    }
  }

  /** Files watched for certificates and keys; the CRL's own watch is reported under `crl`. */
  private secretFilesWatched(): number {
    return (this.watcher?.size ?? 0) - (this.o.crlFile && this.watcher ? 1 : 0);
  }

  /** How many file secrets are held and how many files watched (for tests and /debug/certs). */
  fileSecretCount(): { secrets: number; watchedFiles: number } {
    return { secrets: this.fileSecrets.size, watchedFiles: this.secretFilesWatched() };
  }

  /** The current workload certificate's facts (never the key). */
  current(): (CertInfo & { source: string; nextRotation?: number }) | undefined {
    return this.workload && { ...this.workload.leaf, source: this.workload.source, nextRotation: this.nextRotation };
  }

  readiness(): Condition {
    // Until Envoy asks for the workload certificate, nothing waits for it (mounted files that are missing or bad
    // included, as in Istio, where readiness never looks at certificates).
    if (!this.wanted) return { ready: true, reason: '' };
    if (!this.o.signer && !this.o.mountedDir && !this.workload)
      return {
        ready: false,
        reason:
          'Envoy asks for a workload certificate (ISTIO_MUTUAL), and there is neither a CA nor mounted certificates',
      };
    return this.workload
      ? { ready: true, reason: '' }
      : { ready: false, reason: `no workload certificate yet${this.ca.lastError ? ` (${this.ca.lastError})` : ''}` };
  }

  routes(): StatusRoute[] {
    return [{ method: 'GET', path: '/debug/certs', localOnly: true, handler: () => json(this.debug()) }];
  }

  debug(): Record<string, unknown> {
    const w = this.workload;
    const iso = (t: number | undefined) => (t ? new Date(t).toISOString() : undefined);
    return {
      identity: this.o.identity,
      source: this.o.mountedDir
        ? `files in ${this.o.mountedDir}`
        : this.o.signer
          ? `CA ${this.o.signer.address}`
          : 'none (file certificates only)',
      certificate: w && {
        identities: w.leaf.identities,
        serial: w.leaf.serial,
        notBefore: iso(w.leaf.notBefore),
        notAfter: iso(w.leaf.notAfter),
        source: w.source,
      },
      nextRotation: iso(this.nextRotation),
      ca: this.o.signer && {
        address: this.o.signer.address,
        reachable: this.ca.reachable,
        lastSuccess: iso(this.ca.lastSuccess),
        lastFailure: iso(this.ca.lastFailure),
        lastError: this.ca.lastError || undefined,
      },
      fileSecrets: [...this.fileSecrets.values()].map((f) => ({ name: f.name, loaded: !!f.value, error: f.error })),
      rootsFromControlPlane: this.extraRoots.length,
      crl: this.o.crlFile && { file: this.o.crlFile, loaded: !!this.crlPem, error: this.crlError || undefined },
      watchedFiles: this.secretFilesWatched(),
    };
  }

  registerMetrics(registry: Registry): void {
    const c = this.counts;
    const self = this;
    registry.registerMetric(
      new Counter({
        name: 'istio_agent_certificates_issued_total',
        help: 'Workload certificates obtained (from a CA or mounted files)',
        registers: [],
        collect() {
          this.reset();
          this.inc(c.issued);
        },
      }),
    );
    registry.registerMetric(
      new Counter({
        name: 'istio_agent_certificates_rotated_total',
        help: 'Workload certificates replaced by a newer one',
        registers: [],
        collect() {
          this.reset();
          this.inc(c.rotated);
        },
      }),
    );
    registry.registerMetric(
      new Counter({
        name: 'istio_agent_certificate_failures_total',
        help: 'Certificates or CA answers refused, by reason',
        labelNames: ['reason'],
        registers: [],
        collect() {
          this.reset();
          for (const [reason, n] of c.failed) this.inc({ reason }, n);
        },
      }),
    );
    // The Go agent's names (security/pkg/nodeagent/cache/monitoring.go).
    registry.registerMetric(
      new Counter({
        name: 'istio_agent_num_file_watcher_failures_total',
        help: 'Number of times file watcher failed to add watchers',
        registers: [],
        collect() {
          this.reset();
          this.inc(self.watcher?.failures ?? 0);
        },
      }),
    );
    registry.registerMetric(
      new Counter({
        name: 'istio_agent_num_file_secret_failures_total',
        help: 'Number of times secret generation failed for files',
        registers: [],
        collect() {
          this.reset();
          this.inc(self.fileSecretFailures);
        },
      }),
    );
    registry.registerMetric(
      new Gauge({
        name: 'istio_agent_cert_expiry_seconds',
        help: 'Seconds until the workload certificate expires',
        registers: [],
        collect() {
          if (self.workload) this.set((self.workload.leaf.notAfter - self.now()) / 1000);
        },
      }),
    );
  }

  // ---- from a CA ----

  private async fetch(): Promise<void> {
    if (this.state !== 'running' || this.fetching) return;
    this.fetching = true;
    const signer = this.o.signer!;
    try {
      const what = { identity: this.o.identity, algorithm: this.o.algorithm, pkcs8: this.o.pkcs8 };
      const began = performance.now();
      let made = keyAndCsrNow(what);
      if (!made) {
        // The key is still being made: the CA's connection (and its TLS) is opened meanwhile, not after it.
        signer.connectAhead?.();
        made = await generateKeyAndCsr(what);
      }
      const { keyPem, csrPem } = made;
      const csrAt = performance.now();
      log.debug(
        `key and CSR for ${this.o.identity} ready in ${(csrAt - began).toFixed(1)} ms; asking CA ${signer.address}`,
      );
      let chainPems: string[];
      try {
        chainPems = await signer.sign(csrPem, Math.max(1, Math.round(this.o.ttlMs / 1000)));
        log.debug(`CA ${signer.address} signed in ${(performance.now() - csrAt).toFixed(1)} ms`);
      } catch (e) {
        const local = (e as AgentError).code === 'IO' || (e as AgentError).code === 'CONFIG_INVALID';
        if (!local) this.ca.reachable = caAnswered(e);
        throw Object.assign(e as Error, {
          reason: local ? 'credentials' : this.ca.reachable ? 'ca_refused' : 'ca_unreachable',
        });
      }
      this.ca.reachable = true;
      const where = `certificate from CA ${signer.address}`;
      let checked;
      try {
        const chain = chainPems.flatMap((p, i) => parseCerts(p, `${where}, chain element ${i + 1}`));
        const last = chain[chain.length - 1]!;
        checked = checkChain({ chain, roots: [last], keyPem, identity: this.o.identity, now: this.now(), where });
      } catch (e) {
        throw Object.assign(e as Error, { reason: 'bad_chain' });
      }
      if (this.state !== 'running') return;
      this.ca.lastSuccess = this.now();
      this.ca.lastError = '';
      this.lastFailure = '';
      this.attempt = 0;
      this.install({
        chainPem: checked.chainPem,
        keyPem,
        rootPem: checked.rootPem,
        leaf: checked.leaf,
        source: `CA ${signer.address}`,
      });
      this.scheduleRotation(rotationTime(checked.leaf, this.o.graceRatio, this.o.graceJitter, this.rand, this.now()));
    } catch (e) {
      if (this.state !== 'running') return;
      const reason = (e as { reason?: FailureReason }).reason ?? 'ca_refused';
      this.fail(reason, errorMessage(e));
      this.ca.lastFailure = this.now();
      this.ca.lastError = errorMessage(e);
      this.attempt++;
      const delay = caRetryDelay(this.attempt, this.o.backoff, this.rand);
      const w = this.workload;
      const keeps = w
        ? `; the current certificate (serial ${w.leaf.serial}, expires ${new Date(w.leaf.notAfter).toISOString()}) stays in use`
        : '';
      log.warn(`retrying the CA in ${delay} ms (attempt ${this.attempt})${keeps}`);
      this.scheduleRotation(this.now() + delay);
    } finally {
      this.fetching = false;
    }
  }

  private scheduleRotation(at: number): void {
    if (this.rotateTimer) clearTimeout(this.rotateTimer);
    if (this.state !== 'running') return;
    this.nextRotation = at;
    // setTimeout takes at most ~24.8 days; a longer wait is re-armed when it fires.
    const delay = Math.min(Math.max(0, at - this.now()), 2 ** 31 - 1);
    this.rotateTimer = setTimeout(() => {
      if (this.now() + 5 < at) this.scheduleRotation(at);
      else void this.fetch();
    }, delay);
    this.rotateTimer.unref();
  }

  private install(w: Workload): void {
    const old = this.workload;
    this.workload = w;
    this.counts.issued++;
    if (old) this.counts.rotated++;
    log.info(
      `workload certificate ${old ? 'rotated' : 'ready'}: ${w.leaf.identities.join(', ') || 'no URI SAN'}, serial ${w.leaf.serial}, valid ${new Date(w.leaf.notBefore).toISOString()} to ${new Date(w.leaf.notAfter).toISOString()}, from ${w.source}`,
    );
    if (this.o.outputDir) {
      try {
        const mode = this.o.outputMode ?? 0o600;
        fs.mkdirSync(this.o.outputDir, { recursive: true, mode: mode & 0o044 ? 0o755 : 0o700 });
        writeFileAtomic(path.join(this.o.outputDir, KEY), w.keyPem, mode);
        writeFileAtomic(path.join(this.o.outputDir, CERT_CHAIN), w.chainPem, mode);
        // With the control plane's roots, as Go writes the merged bundle.
        writeFileAtomic(path.join(this.o.outputDir, ROOT_CERT), mergeRoots(w.rootPem, this.extraRoots), mode);
      } catch (e) {
        this.fail('output', `cannot write OUTPUT_CERTS: ${errorMessage(e)}`);
      }
    }
    this.emit(WORKLOAD_SECRET);
    if (!old || old.rootPem !== w.rootPem) this.emit(ROOT_SECRET);
  }

  private emit(name: string): void {
    for (const fn of this.listeners) {
      try {
        fn(name);
      } catch (e) {
        log.error(`secret update listener failed for ${name}: ${errorMessage(e)}`);
      }
    }
  }

  private fail(reason: FailureReason, message: string): void {
    this.counts.failed.set(reason, (this.counts.failed.get(reason) ?? 0) + 1);
    // Re-reads of the same bad file (or retries meeting the same CA error) log once.
    if (message === this.lastFailure) return;
    this.lastFailure = message;
    log.error(`refused: ${message}`);
  }

  // ---- mounted files ----

  /** Reads the mounted directory; true when it checked out (or nothing changed). */
  private loadMounted(): boolean {
    const dir = this.o.mountedDir!;
    const where = `mounted certificates in ${dir}`;
    try {
      const chainText = readText(path.join(dir, CERT_CHAIN));
      const keyPem = readText(path.join(dir, KEY));
      const chain = parseCerts(chainText, path.join(dir, CERT_CHAIN));
      const rootFile = path.join(dir, ROOT_CERT);
      const roots = fs.existsSync(rootFile) ? parseCerts(readText(rootFile), rootFile) : [chain[chain.length - 1]!];
      const checked = checkChain({ chain, roots, keyPem, now: this.now(), where });
      const w = this.workload;
      if (w && w.chainPem === checked.chainPem && w.keyPem === keyPem && w.rootPem === checked.rootPem) return true;
      this.install({ chainPem: checked.chainPem, keyPem, rootPem: checked.rootPem, leaf: checked.leaf, source: where });
      this.nextRotation = undefined;
      return true;
    } catch (e) {
      this.fileSecretFailures++;
      this.fail(
        'bad_file',
        `${errorMessage(e)}${this.workload ? `; keeping serial ${this.workload.leaf.serial}` : ''}`,
      );
      return false;
    }
  }

  private addFileSecret(name: string): void {
    if (this.fileSecrets.has(name)) return;
    const parsed = parseSecretName(name);
    let files: string[];
    if (parsed?.kind === 'file-cert') files = [parsed.cert, parsed.key];
    else if (parsed?.kind === 'file-root') files = [parsed.file];
    else if (parsed?.kind === 'system-root') {
      const bundle = SYSTEM_BUNDLES.find((p) => fs.existsSync(p));
      files = bundle ? [bundle] : [];
    } else return;
    const f: FileSecret = { name, files, loading: false, again: false };
    this.fileSecrets.set(name, f);
    if (this.state === 'running') this.startFileSecret(f);
  }

  private startFileSecret(f: FileSecret): void {
    for (const file of f.files) {
      let users = this.fileUsers.get(file);
      if (!users) this.fileUsers.set(file, (users = new Set()));
      users.add(f);
      this.watcher!.add({ path: file, mode: 'content' });
    }
    void this.loadFileSecret(f);
  }

  /** Reads the secret's files (asynchronously, one read at a time per secret); emits when the value changed. */
  private async loadFileSecret(f: FileSecret): Promise<void> {
    if (f.loading) {
      f.again = true;
      return;
    }
    f.loading = true;
    try {
      const v = await this.readFileSecret(f);
      if (this.fileSecrets.get(f.name) !== f || this.state !== 'running') return;
      const changed = !f.value || JSON.stringify(f.value) !== JSON.stringify(v);
      f.value = v;
      f.error = undefined;
      this.failing.delete(f);
      if (!this.failing.size && !this.mountedFailing) {
        this.fileRetryUntil = undefined;
        this.lastFailure = '';
      }
      if (changed) this.emit(f.name);
    } catch (e) {
      if (this.fileSecrets.get(f.name) !== f || this.state !== 'running') return;
      this.fileSecretFailures++;
      const again = f.error === errorMessage(e);
      f.error = errorMessage(e);
      this.failing.add(f);
      // Each secret's error is logged when it first appears or changes, not at every retry.
      if (again) this.counts.failed.set('bad_file', (this.counts.failed.get('bad_file') ?? 0) + 1);
      else this.fail('bad_file', `secret ${f.name}: ${f.error}${f.value ? '; keeping the last good one' : ''}`);
      this.scheduleFileRetry();
    } finally {
      f.loading = false;
      if (f.again && this.fileSecrets.get(f.name) === f) {
        f.again = false;
        void this.loadFileSecret(f);
      }
    }
  }

  private async readFileSecret(f: FileSecret): Promise<SecretValue> {
    if (!f.files.length)
      throw new AgentError('IO', `no system trust bundle found (looked in ${SYSTEM_BUNDLES.join(', ')})`);
    // Asked for by whoever can connect to the SDS socket: only what that uid could read itself.
    const reader: Reader | undefined = this.o.sdsSocket ? socketReader(this.o.sdsSocket) : undefined;
    const read = async (file: string) => (await readNamedFile(file, { reader })).toString('utf8');
    if (f.name.startsWith('file-cert:')) {
      const [certFile, keyFile] = f.files as [string, string];
      const [chainText, keyPem] = await Promise.all([read(certFile), read(keyFile)]);
      const chain = parseCerts(chainText, certFile);
      // Only the pair is checked here: who issued it is for the peer to verify.
      checkKeyPair(chain[0]!, keyPem, `${certFile} with ${keyFile}`);
      checkValidity(chain[0]!, this.now(), certFile);
      return { kind: 'tls', certChainPem: certificatesOnly(chainText), keyPem };
    }
    const text = await read(f.files[0]!);
    parseCerts(text, f.files[0]!);
    // A bundle that also holds a key (a combined cert+key file) gives only its certificates.
    return { kind: 'root', rootPem: certificatesOnly(text) };
  }

  private filesChanged(changed: string[]): void {
    if (this.state !== 'running') return;
    if (this.o.crlFile && changed.includes(this.o.crlFile)) this.loadCrl();
    if (changed.some((p) => this.mountedFiles.includes(p))) this.reloadMounted();
    const affected = new Set<FileSecret>();
    for (const p of changed) for (const f of this.fileUsers.get(p) ?? []) affected.add(f);
    for (const f of affected) void this.loadFileSecret(f);
  }

  /** Reads the CRL file; pushes ROOTCA when what it serves changed. A bad read keeps the last good CRL. */
  private loadCrl(): void {
    const r = readCrl(this.o.crlFile!);
    if (r.error) {
      if (r.error !== this.crlError)
        this.fail('bad_file', r.error + (this.crlPem ? '; keeping the last good CRL' : ''));
      this.crlError = r.error;
      return;
    }
    this.crlError = '';
    if (r.pem === this.crlPem) return;
    this.crlPem = r.pem;
    const f = this.o.crlFile;
    log.info(r.pem ? `CA CRL from ${f} put into ${ROOT_SECRET}` : `CA CRL ${f} is gone: ${ROOT_SECRET} has no CRL`);
    if (this.workload) this.emit(ROOT_SECRET);
  }

  private mountedFailing = false;
  private get mountedFiles(): string[] {
    const dir = this.o.mountedDir;
    return dir ? [CERT_CHAIN, KEY, ROOT_CERT].map((n) => path.join(dir, n)) : [];
  }

  private reloadMounted(): void {
    this.mountedFailing = !this.loadMounted();
    if (this.mountedFailing) this.scheduleFileRetry();
    else if (!this.failing.size) {
      this.fileRetryUntil = undefined;
      this.lastFailure = '';
    }
  }

  /** A half-written file, or a key swapped before its certificate: read the failing ones again shortly, for a while. */
  private scheduleFileRetry(): void {
    if (this.fileRetryTimer || this.state !== 'running') return;
    this.fileRetryUntil ??= this.now() + FILE_RETRY_FOR_MS;
    if (this.now() > this.fileRetryUntil) {
      this.fileRetryUntil = undefined;
      return;
    }
    this.fileRetryTimer = setTimeout(() => {
      this.fileRetryTimer = undefined;
      if (this.state !== 'running') return;
      if (this.mountedFailing) this.reloadMounted();
      for (const f of [...this.failing]) void this.loadFileSecret(f);
      if (!this.mountedFailing && !this.failing.size) this.fileRetryUntil = undefined;
    }, FILE_RETRY_MS);
    this.fileRetryTimer.unref();
  }
}

const PEM_CERT = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

// The CRL file is read as Istio's SDS service checks it (present or not) at each ROOTCA; here a change is also
// pushed. A file that holds no CRL keeps the last good one (dropping it would accept revoked peers).
export interface CrlRead {
  pem?: string;
  error?: string;
}
export function readCrl(file: string): CrlRead {
  // As Go's isCrlFileProvided (os.Stat): no file, no CRL.
  if (!fs.existsSync(file)) return {};
  let text: string;
  try {
    text = readNamedFileSync(file).toString('utf8');
  } catch (e) {
    return { error: `cannot read the CA CRL: ${errorMessage(e)}` };
  }
  const blocks = text.match(PEM_CRL);
  if (!blocks) return { error: `the CA CRL ${file} holds no PEM X509 CRL` };
  return { pem: blocks.join('\n') + '\n' };
}

/** The certificate blocks of a PEM text, nothing else (no key that shares the file). */
function certificatesOnly(pem: string): string {
  return (pem.match(PEM_CERT) ?? []).join('\n') + '\n';
}

/** The mounted certificate files: fixed names, read synchronously, but still only regular files of bounded size. */
function readText(file: string): string {
  return readNamedFileSync(file).toString('utf8');
}

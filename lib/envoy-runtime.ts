// The real Envoy runtime behind the supervisor: bootstrap files, `--mode validate`, spawning epochs with
// the arguments of lib/envoy-args.ts, admin probes, the base id file and the hot-restart shared memory.
// Also builds the desired config (with its content hash) that the supervisor compares.

import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { AgentConfig } from './config';
import { activeDownstreamConnections, drainListeners, serverInfo, type AdminAddress } from './envoy-admin';
import { envoyArgs, bootstrapFileName } from './envoy-args';
import { envoyEnvironment } from './tls-policy';
import {
  envoyCredentials,
  runEnvoyCommand,
  spawnEnvoy,
  type EnvoyCredentials,
  type EnvoyProcess,
  type RealEnvoyProcess,
} from './envoy-process';
import { renderBootstrap } from './bootstrap';
import { writeFileAtomic } from './fs-atomic';
import { clearInitializing, isInitializing, recordOwner, removeShm, sweepOrphans } from './hot-restart-shm';
import { configPathHeld } from './config-path-lock';
import type { DesiredConfig, EnvoyRuntime, LiveProbe } from './supervisor';
import { journalLine, scope } from './log';

const log = scope('envoy');

/** A DesiredConfig that also knows how to build Envoy's arguments for any epoch. */
export interface EnvoyDesiredConfig extends DesiredConfig {
  argsFor(epoch: number, file: string, baseId: number | undefined): string[];
  /** ENVOY_ADMIN_MODE=uds: the admin socket, whose directory the agent prepares before each epoch. */
  adminSocket: string;
  /** The bootstrap as written to envoy-rev<N>.json, rendered once (for the hash) and not again at each write. */
  bootstrapText: string;
}

export interface DesiredInputs {
  cfg: AgentConfig;
  bootstrap: Record<string, unknown>;
  ipv6: boolean;
  coreDump: boolean;
  /** Identity of the Envoy binary file (size, mtime, inode), so an upgrade in place changes the hash. */
  binaryId: string;
  /** Bumped by SIGHUP: forces a new epoch even when nothing else changed. */
  generation: number;
  /** Fingerprint of the files Envoy reads itself (certificates, keys): their change means a new epoch too. */
  filesId: string;
}

export function baseIdFile(cfg: AgentConfig): string {
  return path.join(cfg.proxy.configPath, 'envoy-base-id');
}

/** The directory of Envoy's hot-restart sockets: 0700, owned by Envoy's user. */
export function hotRestartDir(cfg: AgentConfig): string {
  return path.join(path.resolve(cfg.proxy.configPath), 'envoy-hot-restart');
}

// Envoy appends `_udp_parent_<base id x 10 + epoch % 3>`; sun_path holds 107 bytes and a NUL. Envoy computes that
// number in 32 bits and sign-extends it to 64, so a dynamic base id above 214748364 (Envoy draws up to 2^28 - 1)
// gives 20 digits (`s_parent_18446744071757335170`), not 10.
const SOCKET_SUFFIX_MAX = '_udp_parent_'.length + 20;

/**
 * Envoy's hot-restart socket path in configPath, or undefined when configPath is too long for a Unix socket
 * (then Envoy keeps its abstract default, and the agent says so once).
 */
export function hotRestartSocket(cfg: AgentConfig): string | undefined {
  const p = path.join(hotRestartDir(cfg), 's');
  return Buffer.byteLength(p) + SOCKET_SUFFIX_MAX <= 107 ? p : undefined;
}

/** The bootstrap's admin address (custom bootstraps choose their own): a TCP address, or a Unix socket. */
export function adminAddressOf(bootstrap: Record<string, unknown>, fallbackPort: number): AdminAddress {
  const address = (bootstrap.admin as Record<string, unknown> | undefined)?.address as
    Record<string, unknown> | undefined;
  const pipe = address?.pipe as { path?: string } | undefined;
  if (typeof pipe?.path === 'string' && pipe.path !== '') return { socketPath: pipe.path };
  const sa = address?.socket_address as { address?: string; port_value?: number } | undefined;
  let host = sa?.address ?? '127.0.0.1';
  if (host === '0.0.0.0') host = '127.0.0.1';
  if (host === '::') host = '::1';
  return { host, port: sa?.port_value ?? fallbackPort };
}

export function makeDesiredConfig(i: DesiredInputs): EnvoyDesiredConfig {
  const { cfg } = i;
  const hotRestart = hotRestartSocket(cfg);
  const argsFor = (epoch: number, file: string, baseId: number | undefined) =>
    envoyArgs({
      cfg,
      configFile: file,
      epoch,
      ipv6: i.ipv6,
      coreDump: i.coreDump,
      hotRestartSocket: hotRestart,
      baseId: baseId === undefined ? { dynamic: true, path: baseIdFile(cfg) } : { id: baseId },
    });
  const text = renderBootstrap(i.bootstrap);
  const hash = createHash('sha256')
    .update(text)
    .update('\0')
    .update(argsFor(1, 'FILE', 1).join(' '))
    .update('\0')
    .update(`${cfg.proxy.binaryPath}\0${i.binaryId}\0${i.generation}\0${i.filesId}`)
    .digest('hex');
  return {
    hash,
    bootstrap: i.bootstrap,
    binaryPath: cfg.proxy.binaryPath,
    admin: adminAddressOf(i.bootstrap, cfg.proxy.proxyAdminPort),
    inboundOnlyDrain: cfg.proxyType === 'sidecar',
    argsFor,
    adminSocket: cfg.envoyAdminSocket,
    bootstrapText: text,
  };
}

function tailOf(output: string): string {
  return output
    .split('\n')
    .filter((l) => l.trim())
    .slice(-3)
    .join(' | ')
    .slice(0, 2000);
}

/** Size, mtime and inode: cheap, and changes when a binary is replaced or rewritten in place. */
export function binaryIdentity(file: string): string {
  try {
    const st = fs.statSync(file);
    return `${st.size}:${st.mtimeMs}:${st.ino}`;
  } catch {
    return 'missing';
  }
}

export class RealEnvoyRuntime implements EnvoyRuntime {
  /** Set when Envoy runs as another user than the agent (ENVOY_UID/ENVOY_GID, or Istio's root + DNS on :53 rule). */
  readonly credentials: EnvoyCredentials | undefined;

  constructor(
    private readonly cfg: AgentConfig,
    private readonly env: NodeJS.ProcessEnv = process.env,
  ) {
    this.credentials = envoyCredentials(env, process.getuid?.() ?? -1);
  }

  writeBootstrap(epoch: number, desired: DesiredConfig): string {
    const file = path.join(this.cfg.proxy.configPath, bootstrapFileName(epoch));
    // Written again at every start and change: atomic, not durable (see lib/fs-atomic.ts).
    writeFileAtomic(file, (desired as EnvoyDesiredConfig).bootstrapText, 0o600, { durable: false });
    this.giveToEnvoy(file);
    return file;
  }

  /** The bootstrap stays 0600, owned by Envoy's user (and group) instead of the agent's. */
  private giveToEnvoy(file: string): void {
    const c = this.credentials;
    if (c) fs.chownSync(file, c.uid ?? -1, c.gid);
  }

  /**
   * What Envoy opens as its own user: the agent's xDS and SDS sockets (connecting needs write access to the
   * socket file; they are 0660) and the base id file Envoy writes into the agent's directory.
   */
  private prepareForEnvoyUser(baseId: number | undefined): void {
    // The agent's own SDS socket only: one another server serves is not the agent's to give away.
    for (const socket of [this.cfg.xdsSocket, this.cfg.sdsServeSocket]) {
      try {
        if (fs.lstatSync(socket).isSocket()) this.giveToEnvoy(socket);
      } catch {
        // not served (yet): Envoy retries the connection, and the next epoch's start tries again
      }
    }
    if (baseId === undefined) {
      const file = baseIdFile(this.cfg);
      fs.closeSync(fs.openSync(file, 'a', 0o644));
      this.giveToEnvoy(file);
    }
  }

  private warnedLongPath = false;

  /** Envoy binds its hot-restart sockets here: only its own user may enter, so no other uid can connect. */
  private prepareHotRestartDir(): void {
    if (!hotRestartSocket(this.cfg)) {
      if (!this.warnedLongPath) {
        log.warn(
          `configPath ${this.cfg.proxy.configPath} is too long for Envoy's hot-restart socket path: Envoy ` +
            `uses its abstract socket, which any process in this network namespace can reach`,
        );
      }
      this.warnedLongPath = true;
      return;
    }
    this.envoyOnlyDir(hotRestartDir(this.cfg), "Envoy's hot-restart sockets");
  }

  /** A 0700 directory owned by the user Envoy runs as: Envoy creates its sockets there, nobody else can enter. */
  private envoyOnlyDir(dir: string, what: string): void {
    fs.mkdirSync(dir, { recursive: true, mode: 0o700 });
    if (!fs.lstatSync(dir).isDirectory()) throw new Error(`${dir}, the directory of ${what}, is not a directory`);
    fs.chmodSync(dir, 0o700);
    this.giveToEnvoy(dir);
  }

  /**
   * ENVOY_ADMIN_MODE=uds: the admin socket's directory, 0700 and owned by the user Envoy runs as, which must be able
   * to create the socket there; nobody else can reach into it, not even in the moment between Envoy's bind and its
   * chmod to 0600. The agent (root, when Envoy is another user) still connects.
   */
  private prepareAdminSocketDir(socket: string): void {
    if (!socket) return;
    this.adminSocket = socket;
    this.envoyOnlyDir(path.dirname(socket), "Envoy's admin socket");
  }

  private adminSocket = '';

  /** The admin socket Envoy leaves behind (it does not remove it when it exits), and its directory. */
  removeAdminSocket(): void {
    if (!this.adminSocket) return;
    try {
      fs.rmSync(this.adminSocket, { force: true });
      fs.rmdirSync(path.dirname(this.adminSocket));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOTEMPTY') return;
      log.warn(`could not remove Envoy's admin socket ${this.adminSocket}: ${(err as Error).message}`);
    }
  }

  removeBootstrap(file: string): void {
    fs.rmSync(file, { force: true });
  }

  async validate(desired: DesiredConfig, file: string): Promise<string | undefined> {
    const args = ['--mode', 'validate', '-c', file, '--allow-unknown-static-fields', '-l', 'error'];
    const r = await runEnvoyCommand(desired.binaryPath, args);
    if (r.code === 0) return undefined;
    // Not a verdict on the config: the binary could not be run at all (the launch is retried with backoff).
    if (r.code === 127) throw new Error(`cannot run ${desired.binaryPath}: ${r.output}`);
    // Only an Envoy can reject a bootstrap: a binary that fails even `--version` is not one that works.
    const v = await runEnvoyCommand(desired.binaryPath, ['--version'], 10_000);
    if (v.code !== 0 || !/\bversion: \S+\/\d+\.\d+/.test(v.output)) {
      throw new Error(
        `cannot run ${desired.binaryPath} as Envoy: \`--mode validate\` exited with code ${r.code} (${tailOf(r.output) || 'no output'}) ` +
          `and \`--version\` did not print Envoy's version (exit code ${v.code}${v.output ? `: ${tailOf(v.output)}` : ''})`,
      );
    }
    // Envoy's critical/error line says why; the lines after it may be the config it printed back.
    const why = r.output.split('\n').find((l) => /\]\[(critical|error)\]|\t(critical|error)\t/.test(l));
    if (why) return why.replace(/^\[[^\]]*\]\[\d+\]\[\w+\]\[\w+\] /, '').slice(0, 600);
    return tailOf(r.output) || `exit code ${r.code}`;
  }

  async binaryHotRestartVersion(binary: string): Promise<string> {
    const r = await runEnvoyCommand(binary, ['--hot-restart-version'], 10_000);
    if (r.code !== 0) throw new Error(`${binary} --hot-restart-version failed: ${r.output}`);
    return r.output.trim();
  }

  spawn(epoch: number, desired: DesiredConfig, file: string, baseId: number | undefined): EnvoyProcess {
    const args = (desired as EnvoyDesiredConfig).argsFor(epoch, file, baseId);
    const credentials = this.credentials;
    this.prepareHotRestartDir();
    // From the epoch's own config: ENVOY_ADMIN_MODE may change with a reload.
    this.prepareAdminSocketDir((desired as EnvoyDesiredConfig).adminSocket);
    if (credentials) {
      this.prepareForEnvoyUser(baseId);
      if (epoch === 0)
        log.info(
          `starting Envoy as uid ${credentials.uid ?? process.getuid?.()} gid ${credentials.gid}: ${credentials.reason}`,
        );
    }
    // COMPLIANCE_POLICY fips-*: GRPC_SSL_CIPHER_SUITES limits Envoy's Google gRPC client, as Go sets it.
    const env = envoyEnvironment(this.cfg.compliancePolicy, this.env);
    return spawnEnvoy(desired.binaryPath, args, {
      epoch,
      env,
      credentials,
      passThrough: (line) => process.stderr.write(journalLine(line) + '\n'),
    });
  }

  failureReason(proc: EnvoyProcess): string {
    return (proc as RealEnvoyProcess).output?.reason() ?? '';
  }

  async probe(admin: AdminAddress): Promise<LiveProbe | undefined> {
    const info = await serverInfo(admin, 500);
    return { epoch: info.restartEpoch, state: info.state, hotRestartVersion: info.hotRestartVersion };
  }

  private recorded: number | undefined;

  /** Also records, beside the segment, that it is this agent's (see sweepOrphanedShm). */
  readBaseId(): number | undefined {
    let id: number | undefined;
    try {
      const text = fs.readFileSync(baseIdFile(this.cfg), 'utf8').trim();
      id = /^\d+$/.test(text) ? Number(text) : undefined;
    } catch {
      return undefined;
    }
    if (id !== undefined && id !== this.recorded) {
      recordOwner(id, this.cfg.proxy.configPath);
      this.recorded = id;
    }
    return id;
  }

  /** With the base id go Envoy's hot-restart sockets (Envoy leaves them behind). */
  clearBaseId(): void {
    fs.rmSync(baseIdFile(this.cfg), { force: true });
    fs.rmSync(hotRestartDir(this.cfg), { recursive: true, force: true });
  }

  isInitializing(baseId: number): boolean | undefined {
    return isInitializing(baseId);
  }

  clearInitializing(baseId: number): boolean {
    return clearInitializing(baseId);
  }

  removeShm(baseId: number): void {
    removeShm(baseId);
    if (this.recorded === baseId) this.recorded = undefined;
  }

  drain(admin: AdminAddress, inboundOnly: boolean): Promise<void> {
    return drainListeners(admin, { inboundOnly });
  }

  activeConnections(admin: AdminAddress): Promise<number> {
    return activeDownstreamConnections(admin, [this.cfg.envoyStatusPort, this.cfg.envoyPrometheusPort]);
  }
}

/**
 * A previous agent that was killed leaves its base id file, bootstraps and Envoy's shared memory behind; remove
 * them before the first epoch so /dev/shm does not collect segments across restarts of the agent. Only call
 * this while holding configPath (lib/config-path-lock.ts): then nothing in it belongs to a live agent.
 */
export function removeStaleHotRestartState(cfg: AgentConfig): void {
  const rt = new RealEnvoyRuntime(cfg);
  const stale = rt.readBaseId();
  if (stale !== undefined) rt.removeShm(stale);
  rt.clearBaseId();
  for (const f of fs.readdirSync(cfg.proxy.configPath)) {
    if (/^envoy-rev\d+\.json$/.test(f)) fs.rmSync(path.join(cfg.proxy.configPath, f), { force: true });
  }
}

/**
 * Segments left by agents that were killed (SIGKILL, OOM) with a configPath never used again: removed when the
 * agent that recorded one is provably gone (its pid is dead and nobody holds its configPath).
 */
export async function sweepOrphanedShm(): Promise<void> {
  const removed = await sweepOrphans(async (o) => !processAlive(o.pid) && !(await configPathHeld(o.configPath)));
  for (const id of removed) log.info(`removed the shared memory of base id ${id}, left by a pilot-agent that is gone`);
}

function processAlive(pid: number): boolean {
  if (pid === process.pid) return true;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

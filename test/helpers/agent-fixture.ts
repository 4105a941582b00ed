// The one way an agent-level test runs the real agent (dist/pilot-agent): agentFixture() makes its temp dir and
// picks its ports (free ones on loopback, or Istio's fixed ones inside a network namespace), start() writes the
// env (PROXY_CONFIG with short drains, pod identity, Envoy's status and Prometheus ports), spawns the agent and
// waits until it is ready; close() removes everything it started (the agent, its Envoys, their shared memory,
// the sockets and files in the temp dir, the namespace), the same way for every test and also when one failed.
//
//   const agent = await agentFixture({ prefix: 'pa-web-' });
//   try {
//     await agent.start({ args: ['proxy', 'sidecar', '--standalone', cfgDir], env: { POD_NAME: 'web' } });
//     ... agent.log(), agent.ports.status, agent.proc ...
//   } finally {
//     await agent.close();
//   }

import type { ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { startAgent, type RunningAgent } from './agent';
import { envoyBin, freePort, httpRequest, pidAlive, tempDir, type TempDir, waitFor } from './harness';
import { createNetns, type Netns } from './netns';

export interface AgentPorts {
  /** The agent's status server (PROXY_CONFIG statusPort). */
  status: number;
  /** Envoy's admin (PROXY_CONFIG proxyAdminPort). */
  admin: number;
  /** ENVOY_STATUS_PORT and ENVOY_PROMETHEUS_PORT. */
  envoyStatus: number;
  prometheus: number;
}

/** Istio's own ports: only inside a network namespace the test made. */
export const FIXED_PORTS: Readonly<AgentPorts> = Object.freeze({
  status: 15020, admin: 15000, envoyStatus: 15021, prometheus: 15090,
});

export interface FixtureOptions {
  /** Prefix of the temp dir's name. */
  prefix?: string;
  /** A temp dir the test made already (close() removes it too) instead of a new one. */
  dir?: TempDir;
  /** Mode of the temp dir (0o755 where another uid, such as Envoy's, must enter it). */
  mode?: number;
  /**
   * Run inside a network namespace: `true` or `{ files, ip }` (see createNetns) for one of its own, removed by
   * close(); or a Netns the test made and shares between agents (the test removes it). The ports are then
   * FIXED_PORTS unless `ports` names others.
   */
  netns?: boolean | { files?: Record<string, string>; ip?: string } | Netns;
  /** Ports to use instead of the ones picked. */
  ports?: Partial<AgentPorts>;
}

export type Readiness =
  /** /healthz/ready answers 200 (the default). */
  | 'ready'
  /** The status server answers at all (any status). */
  | 'listening'
  /** Envoy's first epoch is live (/debug/epochs): for a custom bootstrap that readiness does not cover. */
  | 'live'
  /** Nothing: the test waits for what it needs. */
  | 'none'
  /** Resolves truthy once ready (polled). */
  | ((agent: AgentFixture) => Promise<unknown> | unknown);

export interface StartOptions {
  /** The agent's command line (default `proxy sidecar`). */
  args?: string[];
  /**
   * Merged over the defaults: configPath <dir>/proxy, the real Envoy, the fixture's ports, drains of 1 s/2 s/1 s.
   * A key set to undefined is left out; `null` instead of an object: no PROXY_CONFIG at all.
   */
  proxyConfig?: Record<string, unknown> | null;
  /**
   * Merged over the defaults: PROXY_CONFIG, POD_NAME agent, POD_NAMESPACE test, INSTANCE_IP 127.0.0.1 and the two
   * Envoy ports. A variable set to undefined is left out. PATH and HOME come from the test's process.
   */
  env?: Record<string, string | undefined>;
  /** Working directory (default the temp dir). */
  cwd?: string;
  /** Run as this uid (its gid the same, no supplementary groups). */
  uid?: number;
  /**
   * A command that sets something up and then execs the agent, whose command line is appended: e.g. a private
   * mount namespace, `['unshare', '-m', 'sh', '-c', 'mount ... && exec "$@"', 'sh']`. Inside the namespace, before
   * the uid change. It must exec, so that the pid (and its Envoys, which close() kills) stays the agent's.
   */
  wrap?: string[];
  /**
   * Its stdout and stderr go to this file (a relative path: in the temp dir) instead of pipes that this process
   * reads, so that a test whose event loop is busy cannot slow the agent's synchronous writes; log() reads it.
   */
  logFile?: string;
  ready?: Readiness;
  readyTimeoutMs?: number;
}

export interface AgentFixture {
  dir: TempDir;
  ports: AgentPorts;
  /** The namespace it runs in, if any. */
  netns?: Netns;
  /**
   * For a standalone agent with the embedded CA: each service account's token in `cfgDir`/ca/identities/test
   * (what the CA accepts), and `own`'s as the agent's istio-token in the temp dir (what it presents).
   */
  writeTokens(cfgDir: string, tokens: Record<string, string>, own: string, tokenMode?: number): void;
  /** Spawns the agent and waits for readiness; on failure the error carries the end of its log. Once. */
  start(opts?: StartOptions): Promise<RunningAgent>;
  /** The running agent (after start()). */
  readonly agent: RunningAgent;
  /** The environment it was started with (after start(); PATH and HOME aside), e.g. to run it again one-shot. */
  readonly env: Record<string, string>;
  readonly proc: ChildProcess;
  readonly pid: number;
  readonly exited: RunningAgent['exited'];
  /** Its output so far (still there after close()). */
  log(): string;
  /** Kills the agent (SIGKILL) and waits, as RunningAgent.stop(); the fixture stays for close(). */
  stop(): Promise<void>;
  /** GET on its status server (through curl inside its namespace, if it has one). */
  status(urlPath: string, timeoutMs?: number): Promise<{ status: number; body: string }>;
  /** For `.catch(agent.withLog)`: rethrows with the end of the agent's log. */
  withLog(e: Error): never;
  /**
   * SIGTERM, SIGKILL after `graceMs` (default 10 s), any of its Envoys still alive killed, their shared memory
   * removed, then the temp dir and its own namespace. Safe to call twice, and before start().
   */
  close(graceMs?: number): Promise<void>;
}

/** Makes the temp dir (and namespace) and picks the ports; start() runs the agent. */
export async function agentFixture(opts: FixtureOptions = {}): Promise<AgentFixture> {
  const dir = opts.dir ?? tempDir(opts.prefix ?? 'pa-agent-');
  if (opts.mode !== undefined) fs.chmodSync(dir.path, opts.mode);
  let netns: Netns | undefined;
  let ownNetns = false;
  try {
    if (opts.netns === true || (opts.netns && !('spawn' in opts.netns))) {
      const o = opts.netns === true ? {} : opts.netns;
      netns = createNetns('paagent', o.files, o.ip);
      ownNetns = true;
    } else if (opts.netns) netns = opts.netns;
  } catch (e) {
    dir.cleanup();
    throw e;
  }
  const picked = netns
    ? { ...FIXED_PORTS }
    : {
      status: await freePort(), admin: await freePort(),
      envoyStatus: await freePort(), prometheus: await freePort(),
    };
  const ports: AgentPorts = { ...picked, ...opts.ports };
  let running: RunningAgent | undefined;
  let startedEnv: Record<string, string> | undefined;
  let closing: Promise<void> | undefined;
  const agentOf = (): RunningAgent => {
    if (!running) throw new Error('the agent fixture was not started');
    return running;
  };

  const status = async (urlPath: string, timeoutMs = 5000) => {
    const url = `http://127.0.0.1:${ports.status}${urlPath}`;
    if (!netns) return httpRequest(url, { timeoutMs });
    const secs = String(Math.max(1, Math.ceil(timeoutMs / 1000)));
    const r = await netns.run('curl', ['-s', '-m', secs, '-w', '\n%{http_code}', url], timeoutMs + 2000);
    const at = r.stdout.lastIndexOf('\n');
    return { status: Number(r.stdout.slice(at + 1)) || 0, body: r.stdout.slice(0, Math.max(at, 0)) };
  };

  const fixture: AgentFixture = {
    dir,
    ports,
    netns,
    get agent() {
      return agentOf();
    },
    get env() {
      agentOf();
      return startedEnv!;
    },
    get proc() {
      return agentOf().proc;
    },
    get pid() {
      return agentOf().pid;
    },
    get exited() {
      return agentOf().exited;
    },
    log: () => running?.log() ?? '',
    stop: () => agentOf().stop(),
    status,
    writeTokens(cfgDir, tokens, own, tokenMode) {
      const ids = path.join(cfgDir, 'ca', 'identities', 'test');
      fs.mkdirSync(ids, { recursive: true });
      for (const [sa, token] of Object.entries(tokens)) {
        fs.writeFileSync(path.join(ids, sa), `${token}\n`, { mode: 0o600 });
      }
      const dirOfToken = path.join(dir.path, 'var/run/secrets/tokens');
      fs.mkdirSync(dirOfToken, { recursive: true });
      const mode = tokenMode === undefined ? {} : { mode: tokenMode };
      fs.writeFileSync(path.join(dirOfToken, 'istio-token'), tokens[own]!, mode);
    },
    withLog(e: Error): never {
      throw new Error(`${e.message}\nagent log:\n${fixture.log().slice(-4000)}`);
    },

    async start(s: StartOptions = {}) {
      if (running) throw new Error('the agent fixture was started already');
      const proxyConfig = s.proxyConfig === null ? undefined : {
        configPath: path.join(dir.path, 'proxy'),
        binaryPath: envoyBin(),
        statusPort: ports.status,
        proxyAdminPort: ports.admin,
        drainDuration: '1s',
        parentShutdownDuration: '2s',
        terminationDrainDuration: '1s',
        ...s.proxyConfig,
      };
      const env: Record<string, string | undefined> = {
        ...(proxyConfig ? { PROXY_CONFIG: JSON.stringify(proxyConfig) } : {}),
        POD_NAME: 'agent',
        POD_NAMESPACE: 'test',
        INSTANCE_IP: '127.0.0.1',
        ENVOY_STATUS_PORT: String(ports.envoyStatus),
        ENVOY_PROMETHEUS_PORT: String(ports.prometheus),
        ...s.env,
      };
      const defined = Object.fromEntries(Object.entries(env).filter((e): e is [string, string] => e[1] !== undefined));
      startedEnv = defined;
      const prefix = [
        ...(netns ? ['ip', 'netns', 'exec', netns.name] : []),
        ...(s.wrap ?? []),
        ...(s.uid !== undefined ? ['setpriv', `--reuid=${s.uid}`, `--regid=${s.uid}`, '--clear-groups'] : []),
      ];
      const logFile = s.logFile === undefined ? undefined : path.resolve(dir.path, s.logFile);
      running = startAgent(s.args ?? ['proxy', 'sidecar'], defined, s.cwd ?? dir.path, { prefix, logFile });
      const ready = s.ready ?? 'ready';
      if (ready === 'none') return running;
      const check = ready === 'ready'
        ? async () => (await status('/healthz/ready', 1000)).status === 200
        : ready === 'listening'
          ? async () => (await status('/healthz/ready', 1000)).status > 0
          : ready === 'live'
            ? async () => liveEpoch((await status('/debug/epochs', 1000)).body)
            : () => ready(fixture);
      const started = running;
      await waitFor('the agent ready', async () => {
        if (started.proc.exitCode !== null || started.proc.signalCode !== null) throw new Error('the agent exited');
        return check();
      }, s.readyTimeoutMs ?? 30_000, 100).catch(fixture.withLog);
      return running;
    },

    close(graceMs = 10_000) {
      closing ??= (async () => {
        if (running) {
          const a = running;
          let envoys: number[] = [];
          // Its children only while it runs: once it is reaped, its pid may be another process's.
          if (a.proc.exitCode === null && a.proc.signalCode === null) {
            envoys = childrenOf(a.pid);
            a.proc.kill('SIGTERM');
            const t = setTimeout(() => a.proc.kill('SIGKILL'), graceMs);
            await a.exited;
            clearTimeout(t);
          }
          for (const pid of envoys) if (pidAlive(pid)) process.kill(pid, 'SIGKILL');
          await a.stop(); // removes what a killed agent left in /dev/shm
        }
        if (ownNetns) netns!.remove();
        running?.log(); // read before the temp dir goes, in case the log is a file there
        dir.cleanup();
      })();
      return closing;
    },
  };
  return fixture;
}

/** agentFixture() and start() in one; closes what it made when the start fails. */
export async function startTestAgent(opts: FixtureOptions & StartOptions = {}): Promise<AgentFixture> {
  const a = await agentFixture(opts);
  try {
    await a.start(opts);
  } catch (e) {
    await a.close(2000);
    throw e;
  }
  return a;
}

/** Does a /debug/epochs answer list a live epoch? */
function liveEpoch(body: string): boolean {
  return ((JSON.parse(body) as { epochs?: { state: string }[] }).epochs ?? []).some((e) => e.state === 'live');
}

/** Pids whose parent is `pid` (the agent's Envoys), read from /proc. */
function childrenOf(pid: number): number[] {
  const out: number[] = [];
  for (const name of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${name}/stat`, 'utf8');
      if (Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]) === pid) out.push(Number(name));
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

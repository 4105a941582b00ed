// flags + environment + files -> the frozen config, the node identity and the bootstrap, in one call. Run at
// start-up and again on every watched-file change or SIGHUP; it never starts anything.

import * as fs from 'node:fs';
import * as os from 'node:os';
import { buildConfig, type AgentConfig, type Flags, type SdsSocketFacts } from './config';
import type { Env } from './env';
import { AgentError, errorMessage } from './errors';
import { buildNodeIdentity, type HostAddress, type NodeIdentity } from './node-identity';
import { resolveBootstrap } from './bootstrap-loader';
import { ISTIO_VERSION_IMPLEMENTED } from './istio-version';

export interface Resolved {
  cfg: AgentConfig;
  node: NodeIdentity;
  bootstrap: Record<string, unknown>;
  /** Files that fed the config and bootstrap; a change to any of them means a new epoch. */
  inputs: string[];
}

export function readFileOrUndefined(file: string): string | undefined {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new AgentError('IO', `cannot read ${file}: ${errorMessage(err)}`, err);
  }
}

export function hostAddresses(): HostAddress[] {
  const out: HostAddress[] = [];
  for (const list of Object.values(os.networkInterfaces())) {
    for (const a of list ?? [])
      out.push({ address: a.address, family: a.family === 'IPv6' ? 'IPv6' : 'IPv4', internal: a.internal });
  }
  return out;
}

/** Throws AgentError naming the field and where its value came from. */
export function resolveAll(flags: Flags, env: Env, sockets?: SdsSocketFacts): Resolved {
  const cfg = buildConfig({ flags, env, readFile: readFileOrUndefined, sockets });
  const node = buildNodeIdentity(cfg, env, hostAddresses(), ISTIO_VERSION_IMPLEMENTED);
  const { bootstrap, inputs } = resolveBootstrap(cfg, node, readFileOrUndefined);
  return { cfg, node, bootstrap, inputs: [cfg.meshConfigFile, ...inputs] };
}

// Envoy's hot-restart shared memory, `/dev/shm/envoy_shared_memory_<base id * 10>`: its header is
// { uint64 size; uint64 version; 2 x pthread_mutex_t; atomic uint64 flags } (104 bytes on x86-64, hence
// hot restart version "11.104"). A child that dies before it finished its handshake leaves the INITIALIZING
// flag set, and every later epoch then fails with "previous envoy process is still initializing". The agent,
// once it has seen that child exit, clears the flag so the serving parent can be hot-restarted again.

import * as fs from 'node:fs';
import * as path from 'node:path';

const SHM_DIR = '/dev/shm';
const FLAG_INITIALIZING = 1n;
const FLAGS_OFFSET = 96;
const KNOWN_SIZE = 104n;
const KNOWN_VERSION = 11n;

export function shmPath(baseId: number, dir = SHM_DIR): string {
  return path.join(dir, `envoy_shared_memory_${baseId * 10}`);
}

function readHeader(fd: number): { size: bigint; version: bigint; flags: bigint } | undefined {
  const buf = Buffer.alloc(104);
  if (fs.readSync(fd, buf, 0, 104, 0) !== 104) return undefined;
  return { size: buf.readBigUInt64LE(0), version: buf.readBigUInt64LE(8), flags: buf.readBigUInt64LE(FLAGS_OFFSET) };
}

/** Is the INITIALIZING flag set? undefined when the segment is missing or not a layout we know. */
export function isInitializing(baseId: number, dir = SHM_DIR): boolean | undefined {
  let fd: number | undefined;
  try {
    fd = fs.openSync(shmPath(baseId, dir), 'r');
    const h = readHeader(fd);
    if (!h || h.size !== KNOWN_SIZE || h.version !== KNOWN_VERSION) return undefined;
    return (h.flags & FLAG_INITIALIZING) !== 0n;
  } catch {
    return undefined;
  } finally {
    if (fd !== undefined) fs.closeSync(fd);
  }
}

/**
 * Clears INITIALIZING left by a dead child. Only call once no child of this base id is alive.
 * Returns false (and changes nothing) when the segment's layout is not one this agent knows.
 */
export function clearInitializing(baseId: number, dir = SHM_DIR): boolean {
  let fd: number | undefined;
  try {
    fd = fs.openSync(shmPath(baseId, dir), 'r+');
    const h = readHeader(fd);
    if (!h || h.size !== KNOWN_SIZE || h.version !== KNOWN_VERSION) return false;
    if ((h.flags & FLAG_INITIALIZING) === 0n) return true;
    const out = Buffer.alloc(8);
    out.writeBigUInt64LE(h.flags & ~FLAG_INITIALIZING);
    fs.writeSync(fd, out, 0, 8, FLAGS_OFFSET);
    return true;
  } catch {
    return false;
  } finally {
    if (fd !== undefined) fs.closeSync(fd);
  }
}

export function removeShm(baseId: number, dir = SHM_DIR): void {
  fs.rmSync(shmPath(baseId, dir), { force: true });
  removeOwner(baseId, dir);
}

// ---- owner records: which agent's Envoy a segment belongs to ----
// Envoy never unlinks its segment, and an agent killed with SIGKILL cannot. So next to each segment whose base id
// it learnt, the agent records its configPath; any later agent on the host removes a segment whose recorded
// agent is provably gone (its pid dead and its configPath lock not held). Nothing else in /dev/shm is touched.

const OWNER_PREFIX = 'pilot-agent-envoy-shm-owner_';

function ownerPath(baseId: number, dir: string): string {
  return path.join(dir, `${OWNER_PREFIX}${baseId * 10}`);
}

export interface ShmOwner {
  baseId: number;
  configPath: string;
  pid: number;
}

export function recordOwner(baseId: number, configPath: string, dir = SHM_DIR): void {
  try {
    const file = ownerPath(baseId, dir);
    fs.writeFileSync(
      `${file}.tmp${process.pid}`,
      JSON.stringify({ configPath: path.resolve(configPath), pid: process.pid }),
      { mode: 0o600 },
    );
    fs.renameSync(`${file}.tmp${process.pid}`, file);
  } catch {
    /* best effort: without a record the segment is only cleaned when configPath is reused */
  }
}

export function removeOwner(baseId: number, dir = SHM_DIR): void {
  fs.rmSync(ownerPath(baseId, dir), { force: true });
}

export function listOwners(dir = SHM_DIR): ShmOwner[] {
  let names: string[];
  try {
    names = fs.readdirSync(dir).filter((f) => f.startsWith(OWNER_PREFIX) && /^\d+$/.test(f.slice(OWNER_PREFIX.length)));
  } catch {
    return [];
  }
  const out: ShmOwner[] = [];
  for (const f of names) {
    try {
      const rec = JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8')) as { configPath?: unknown; pid?: unknown };
      const scaled = Number(f.slice(OWNER_PREFIX.length));
      if (typeof rec.configPath === 'string' && typeof rec.pid === 'number' && scaled % 10 === 0)
        out.push({ baseId: scaled / 10, configPath: rec.configPath, pid: rec.pid });
    } catch {
      /* being written, or not ours to judge */
    }
  }
  return out;
}

/**
 * Removes segments (and their records) whose agent is gone: `gone` decides, from the record, whether that agent
 * is provably dead. Returns the base ids removed.
 */
export async function sweepOrphans(gone: (o: ShmOwner) => Promise<boolean>, dir = SHM_DIR): Promise<number[]> {
  const removed: number[] = [];
  for (const o of listOwners(dir)) {
    if (!(await gone(o))) continue;
    removeShm(o.baseId, dir);
    removeOwner(o.baseId, dir);
    removed.push(o.baseId);
  }
  return removed;
}

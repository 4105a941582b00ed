// Reading a file that a peer or a config named (an SDS `file-cert:`/`file-root:` path, a watched input): only a
// regular file, at most a size cap, and never in a way that can stall the event loop. A FIFO blocks open() and
// read() until a writer comes, a character device (/dev/zero) never ends, and a device's open() can have effects
// (a tape rewinds, a watchdog arms), so a path is stat()ed first and not opened unless it is a regular file; the
// file is then opened with O_NONBLOCK and fstat()ed, which settles a swap between the two (stat-then-open alone
// would race). Who else may read it: `reader` names the uid and gid on whose behalf the file is read (the SDS
// client), and a file that principal could not open itself (mode bits, and search permission on every directory
// of its real path) is refused.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { AgentError, errorMessage } from './errors';

/** Larger than any certificate bundle (the OS bundle is about 220 KB); bounds memory per watched name. */
export const MAX_NAMED_FILE_BYTES = 1024 * 1024;

const OPEN_FLAGS = fs.constants.O_RDONLY | fs.constants.O_NONBLOCK | fs.constants.O_NOCTTY;

/**
 * On whose behalf a file is read. `self`: the agent's own credentials (whatever it can open is allowed); otherwise
 * the file must be readable by uid/gid through its mode bits (no supplementary groups: Envoy started under
 * another uid has none), or by anyone when `anyone` is set.
 */
export type Reader = { self: true } | { self?: false; uid: number; gid: number; anyone?: boolean; what: string };

export const SELF: Reader = { self: true };

function fail(file: string, why: string, cause?: unknown): never {
  throw new AgentError('IO', `cannot read ${file}: ${why}`, cause);
}

function describe(st: fs.Stats): string {
  if (st.isFIFO()) return 'a FIFO';
  if (st.isCharacterDevice()) return 'a character device';
  if (st.isBlockDevice()) return 'a block device';
  if (st.isSocket()) return 'a socket';
  if (st.isDirectory()) return 'a directory';
  return 'not a regular file';
}

function checkStat(file: string, st: fs.Stats, maxBytes: number): void {
  if (!st.isFile()) fail(file, `${describe(st)}, not a regular file`);
  if (st.size > maxBytes) fail(file, `${st.size} bytes, more than the ${maxBytes} allowed`);
}

/** Whether `reader` has permission `bit` (4 read, 1 search) on a file with these stats, by mode bits alone. */
function permits(st: fs.Stats, r: Exclude<Reader, { self: true }>, bit: number): boolean {
  if (r.anyone) return (st.mode & bit) !== 0;
  if (r.uid === 0) return true;
  if (st.uid === r.uid) return (st.mode & (bit << 6)) !== 0;
  if (st.gid === r.gid) return (st.mode & (bit << 3)) !== 0;
  return (st.mode & bit) !== 0;
}

const octal = (m: number) => (m & 0o7777).toString(8).padStart(4, '0');

function checkReader(file: string, fd: number, st: fs.Stats, r: Reader): void {
  if (r.self) return;
  if (!permits(st, r, 4)) fail(file, `not readable by ${r.what} (mode ${octal(st.mode)}, owner ${st.uid}:${st.gid})`);
  // The path the kernel resolved for this open (symlinks followed), so a directory it passed through counts.
  let real: string;
  try {
    real = fs.readlinkSync(`/proc/self/fd/${fd}`);
  } catch {
    real = fs.realpathSync(file);
  }
  for (let dir = path.dirname(real); ; dir = path.dirname(dir)) {
    const d = fs.statSync(dir);
    if (!permits(d, r, 1)) {
      fail(file, `${dir} is not searchable by ${r.what} (mode ${octal(d.mode)}, owner ${d.uid}:${d.gid})`);
    }
    if (dir === path.dirname(dir)) break;
  }
}

/** Reads a regular file named by config or a peer, without blocking the event loop. Throws AgentError('IO'). */
export async function readNamedFile(file: string, o: { maxBytes?: number; reader?: Reader } = {}): Promise<Buffer> {
  const max = o.maxBytes ?? MAX_NAMED_FILE_BYTES;
  let fh: fs.promises.FileHandle | undefined;
  try {
    checkStat(file, await fs.promises.stat(file), max);
    fh = await fs.promises.open(file, OPEN_FLAGS);
    const st = await fh.stat();
    checkStat(file, st, max);
    checkReader(file, fh.fd, st, o.reader ?? SELF);
    // One byte more than allowed tells a file that grew after fstat from one that fits.
    const buf = Buffer.alloc(Math.min(max + 1, Math.max(st.size + 1, 4096)));
    let n = 0;
    for (;;) {
      const { bytesRead } = await fh.read(buf, n, buf.length - n, n);
      if (bytesRead === 0) break;
      n += bytesRead;
      if (n > max) fail(file, `grew to more than the ${max} bytes allowed`);
      if (n === buf.length) break;
    }
    return buf.subarray(0, n);
  } catch (e) {
    if (e instanceof AgentError) throw e;
    return fail(file, errorMessage(e), e);
  } finally {
    await fh?.close().catch(() => undefined);
  }
}

/** The same checks, synchronously, for the few fixed files (mounted certificates, bootstrap inputs). */
export function readNamedFileSync(file: string, o: { maxBytes?: number; reader?: Reader } = {}): Buffer {
  const max = o.maxBytes ?? MAX_NAMED_FILE_BYTES;
  let fd: number | undefined;
  try {
    checkStat(file, fs.statSync(file), max);
    fd = fs.openSync(file, OPEN_FLAGS);
    const st = fs.fstatSync(fd);
    checkStat(file, st, max);
    checkReader(file, fd, st, o.reader ?? SELF);
    const buf = Buffer.alloc(Math.min(max + 1, Math.max(st.size + 1, 4096)));
    let n = 0;
    for (;;) {
      const got = fs.readSync(fd, buf, n, buf.length - n, n);
      if (got === 0) break;
      n += got;
      if (n > max) fail(file, `grew to more than the ${max} bytes allowed`);
      if (n === buf.length) break;
    }
    return buf.subarray(0, n);
  } catch (e) {
    if (e instanceof AgentError) throw e;
    return fail(file, errorMessage(e), e);
  } finally {
    if (fd !== undefined) fs.closeSync(fd);
  }
}

/**
 * On whose behalf the SDS server's clients read: whoever can connect to its socket. The socket is 0660 and owned by
 * Envoy's uid and primary group (lib/envoy-runtime.ts gives it to Envoy's user), so that uid and gid; anyone when
 * the socket is writable by others; the agent itself when the socket is the agent's own (Envoy runs as the agent).
 */
export function socketReader(socketPath: string): Reader {
  let st: fs.Stats;
  try {
    st = fs.statSync(socketPath);
  } catch (e) {
    // Nobody can connect to a socket that is gone; refuse rather than guess.
    return { uid: -1, gid: -1, what: `clients of ${socketPath} (cannot stat it: ${errorMessage(e)})`, anyone: true };
  }
  if (st.mode & 0o002) return { uid: -1, gid: -1, anyone: true, what: `anyone (${socketPath} is writable by others)` };
  if (st.uid === process.getuid?.()) return SELF;
  return { uid: st.uid, gid: st.gid, what: `uid ${st.uid} gid ${st.gid} (the owner of ${socketPath})` };
}

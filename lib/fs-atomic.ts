// Whole-file writes that readers (Envoy, file watchers) never see half done: write a temp file in the same
// directory, fsync it, rename it over the target. On any error the temp file is removed and nothing else changes.
// A file the agent writes again at every start (Envoy's bootstrap, the gRPC bootstrap) skips the fsyncs
// (`durable: false`): it must never be seen torn, which the rename alone ensures, but it need not survive a power
// loss, and on a busy node's disk two fsyncs are milliseconds on the path to Envoy's spawn (the Go agent does not
// fsync either).

import * as fs from 'node:fs';
import * as path from 'node:path';
import { randomBytes } from 'node:crypto';
import { AgentError, errorMessage } from './errors';

export function writeFileAtomic(
  file: string,
  data: string | Buffer,
  mode = 0o644,
  o: { durable?: boolean } = {},
): void {
  const durable = o.durable ?? true;
  const dir = path.dirname(file);
  // Same directory, so rename is atomic (same file system); the dot keeps globbing watchers away.
  const tmp = path.join(dir, `.${path.basename(file)}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`);
  let fd: number | undefined;
  try {
    fd = fs.openSync(tmp, 'wx', mode);
    fs.fchmodSync(fd, mode); // the umask must not change what the caller asked for
    const buf = typeof data === 'string' ? Buffer.from(data, 'utf8') : data;
    let off = 0;
    while (off < buf.length) off += fs.writeSync(fd, buf, off, buf.length - off);
    if (durable) fs.fsyncSync(fd);
    fs.closeSync(fd);
    fd = undefined;
    fs.renameSync(tmp, file);
  } catch (e) {
    if (fd !== undefined) closeQuietly(fd);
    removeQuietly(tmp);
    throw new AgentError('IO', `cannot write ${file}: ${errorMessage(e)}`, e);
  }
  if (durable) syncDir(dir);
}

function closeQuietly(fd: number): void {
  try {
    fs.closeSync(fd);
  } catch {
    // already failing; the original error is the one to report
  }
}

function removeQuietly(file: string): void {
  try {
    fs.unlinkSync(file);
  } catch {
    // never created, or already gone
  }
}

/** Makes the rename itself durable; best effort, as some file systems refuse fsync on directories. */
function syncDir(dir: string): void {
  let fd: number | undefined;
  try {
    fd = fs.openSync(dir, 'r');
    fs.fsyncSync(fd);
  } catch {
    // the data is in place either way
  } finally {
    if (fd !== undefined) closeQuietly(fd);
  }
}

/**
 * mkdir -p that always ends. Node's `mkdirSync(dir, { recursive: true })` loops forever where mkdir(2) answers
 * ENOENT although the parent exists (procfs and sysfs: `configPath: /proc/foo` hung the agent with no output);
 * this walks down from the deepest existing ancestor once and reports the first refusal.
 */
export function mkdirs(dir: string, mode = 0o755): void {
  const missing: string[] = [];
  let cur = path.resolve(dir);
  for (;;) {
    try {
      if (!fs.statSync(cur).isDirectory())
        throw new AgentError('IO', `cannot create directory ${dir}: ${cur} is not a directory`);
      break;
    } catch (e) {
      if (e instanceof AgentError) throw e;
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT')
        throw new AgentError('IO', `cannot create directory ${dir}: ${errorMessage(e)}`, e);
    }
    missing.push(cur);
    const parent = path.dirname(cur);
    if (parent === cur) break;
    cur = parent;
  }
  for (const d of missing.reverse()) {
    try {
      fs.mkdirSync(d, { mode });
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'EEXIST' && fs.statSync(d).isDirectory()) continue; // made by someone else meanwhile
      throw new AgentError('IO', `cannot create directory ${dir}: ${errorMessage(e)}`, e);
    }
  }
}

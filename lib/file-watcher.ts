// Watches files that feed the agent: the bootstrap's inputs (watch(): a set replaced as a whole) and the files
// behind SDS names (add()/remove(): one at a time, reference-counted, so a new name costs one file, not a re-watch
// of all). Events are debounced and compared by content hash (by size, mtime and inode for big binaries), so a
// touch without a change triggers nothing. Directories are watched rather than files: atomic renames and
// Kubernetes' `..data` symlink swaps replace the file being watched. A slow poll backs fs.watch up, since some file
// systems (and bind mounts) deliver no events. Checks stat() every file and read only those whose stat changed,
// asynchronously and through lib/named-file.ts: a FIFO or a device put in a watched place is never read.
// A directory that cannot be watched (missing, no permission, the inotify limit) is polled instead, and counted in
// `failures`, as the Go agent counts its certificate watcher's (num_file_watcher_failures_total).

import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { scope } from './log';
import { readNamedFile, readNamedFileSync } from './named-file';

const log = scope('watcher');

export interface WatchedFile {
  path: string;
  /** 'content' hashes the bytes; 'stat' compares size, mtime and inode (for large binaries). */
  mode: 'content' | 'stat';
}

function statOrUndefined(file: string): fs.Stats | undefined {
  try {
    return fs.statSync(file);
  } catch {
    return undefined;
  }
}

function statKey(st: fs.Stats | undefined): string {
  return st ? `${st.dev}:${st.ino}:${st.size}:${st.mtimeMs}:${st.ctimeMs}:${st.mode}` : 'missing';
}

const hashOf = (b: Buffer) => createHash('sha256').update(b).digest('hex');

/** A file's identity for change detection (synchronous: for the few files of a bootstrap). */
export function fingerprint(f: WatchedFile): string {
  let st: fs.Stats;
  try {
    st = fs.statSync(f.path);
  } catch {
    return 'missing';
  }
  if (f.mode === 'stat') return `${st.size}:${st.mtimeMs}:${st.ino}`;
  try {
    return hashOf(readNamedFileSync(f.path));
  } catch {
    // Not a regular file, or too big: its stat is all that is looked at.
    return `unreadable:${statKey(st)}`;
  }
}

interface Entry {
  file: WatchedFile;
  dir: string;
  refs: number;
  stat: string;
  /** Content hash ('content' mode), undefined until first needed. */
  hash?: string;
}

export class FileWatcher {
  private readonly entries = new Map<string, Entry>();
  private readonly dirs = new Map<string, { watcher?: fs.FSWatcher; files: number }>();
  private timer: NodeJS.Timeout | undefined;
  private poll: NodeJS.Timeout | undefined;
  /** Directories with an fs.watch event since the last check, and whether the poll asked for every file. */
  private pendingDirs = new Set<string>();
  private pendingAll = false;
  private checking = false;
  private again = false;
  private closed = false;
  /** Watches that could not be added, and errors of added ones (the directory is polled meanwhile). */
  failures = 0;

  constructor(
    private readonly onChange: (changed: string[]) => void,
    private readonly opts: { debounceMs: number; pollMs?: number },
  ) {}

  /** Replaces the watched set; the current content is the baseline (no event for it). */
  watch(files: WatchedFile[]): void {
    for (const p of [...this.entries.keys()]) this.drop(p);
    for (const f of files) {
      if (!f.path || this.entries.has(f.path)) continue;
      const e = this.addEntry(f);
      e.stat = statKey(statOrUndefined(f.path));
      e.hash = f.mode === 'content' ? fingerprint(f) : undefined;
    }
  }

  /**
   * Watches one more file (counted: remove() as often as add()). Its stat is taken asynchronously (many files may be
   * added at once), before the caller's own read of the file is likely to run; a later change is reported.
   */
  add(f: WatchedFile): void {
    const e = this.entries.get(f.path);
    if (e) {
      e.refs++;
      return;
    }
    if (!f.path) return;
    const added = this.addEntry(f);
    void fs.promises
      .stat(f.path)
      .then(
        (st) => st,
        () => undefined,
      )
      .then((st) => {
        if (added.stat === '') added.stat = statKey(st);
      });
  }

  remove(file: string): void {
    const e = this.entries.get(file);
    if (e && --e.refs <= 0) this.drop(file);
  }

  /** Number of files watched (for /debug and tests). */
  get size(): number {
    return this.entries.size;
  }

  private addEntry(f: WatchedFile): Entry {
    const dir = path.dirname(path.resolve(f.path));
    // '' until the first stat: a check before it records the stat without reporting a change.
    const e: Entry = { file: f, dir, refs: 1, stat: '' };
    this.entries.set(f.path, e);
    let d = this.dirs.get(dir);
    if (!d) {
      d = { files: 0 };
      try {
        const w = fs.watch(dir, { persistent: false }, () => this.kick(dir));
        w.on('error', (err) => {
          this.failures++;
          log.debug(`watch of ${dir} failed (${err.message}); polling it`);
        });
        d.watcher = w;
      } catch (err) {
        this.failures++;
        log.debug(`cannot watch ${dir} (${(err as Error).message}); polling it`);
      }
      this.dirs.set(dir, d);
    }
    d.files++;
    if (!this.poll) {
      this.poll = setInterval(() => {
        this.pendingAll = true;
        this.requestCheck();
      }, this.opts.pollMs ?? 5000);
      this.poll.unref();
    }
    return e;
  }

  private drop(file: string): void {
    const e = this.entries.get(file);
    if (!e) return;
    this.entries.delete(file);
    const d = this.dirs.get(e.dir);
    if (d && --d.files <= 0) {
      d.watcher?.close();
      this.dirs.delete(e.dir);
    }
    if (this.entries.size === 0 && this.poll) {
      clearInterval(this.poll);
      this.poll = undefined;
    }
  }

  private kick(dir: string): void {
    this.pendingDirs.add(dir);
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.requestCheck();
    }, this.opts.debounceMs);
    this.timer.unref();
  }

  /** Checks the files of the directories that had events, or all of them after a poll; one check at a time. */
  private requestCheck(): void {
    if (this.checking) {
      this.again = true;
      return;
    }
    const dirs = this.pendingAll ? undefined : this.pendingDirs;
    if (dirs && dirs.size === 0) return;
    this.pendingAll = false;
    this.pendingDirs = new Set();
    this.checking = true;
    void this.check(dirs).finally(() => {
      this.checking = false;
      if (this.again && !this.closed) {
        this.again = false;
        this.requestCheck();
      }
    });
  }

  private async check(dirs: Set<string> | undefined): Promise<void> {
    const changed: string[] = [];
    const todo = [...this.entries.values()].filter((e) => !dirs || dirs.has(e.dir));
    for (let i = 0; i < todo.length; i += 64) {
      await Promise.all(
        todo.slice(i, i + 64).map(async (e) => {
          if (await this.changed(e)) changed.push(e.file.path);
        }),
      );
      if (this.closed) return;
    }
    if (changed.length) {
      const some =
        changed.length > 20 ? `${changed.slice(0, 20).join(', ')} and ${changed.length - 20} more` : changed.join(', ');
      log.info(`changed: ${some}`);
      this.onChange(changed);
    }
  }

  private async changed(e: Entry): Promise<boolean> {
    const st = await fs.promises.stat(e.file.path).catch(() => undefined);
    const key = statKey(st);
    if (key === e.stat) return false;
    const first = e.stat === '';
    e.stat = key;
    if (first) return false;
    if (e.file.mode === 'stat' || !st) {
      e.hash = undefined;
      return this.entries.get(e.file.path) === e;
    }
    const hash = await readNamedFile(e.file.path).then(hashOf, () => `unreadable:${key}`);
    const was = e.hash;
    e.hash = hash;
    // Removed meanwhile: nothing to report.
    return this.entries.get(e.file.path) === e && hash !== was;
  }

  close(): void {
    this.closed = true;
    for (const d of this.dirs.values()) d.watcher?.close();
    this.dirs.clear();
    this.entries.clear();
    if (this.poll) clearInterval(this.poll);
    this.poll = undefined;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
  }
}

/** Files a bootstrap reads at run time (certificates and keys in DataSources: `filename`). */
export function referencedFiles(value: unknown, out: Set<string> = new Set()): Set<string> {
  if (Array.isArray(value)) for (const v of value) referencedFiles(v, out);
  else if (value && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) {
      if (k === 'filename' && typeof v === 'string' && v !== '/dev/null') out.add(v);
      else referencedFiles(v, out);
    }
  }
  return out;
}

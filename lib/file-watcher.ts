// Watches the files that feed Envoy's bootstrap. Events are debounced and compared by content hash (by size,
// mtime and inode for big binaries), so a touch without a change triggers nothing. Directories are watched
// rather than files: atomic renames and Kubernetes' `..data` symlink swaps replace the file being watched.
// A slow poll backs fs.watch up, since some file systems (and bind mounts) deliver no events.

import { createHash } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { scope } from './log';

const log = scope('watcher');

export interface WatchedFile {
  path: string;
  /** 'content' hashes the bytes; 'stat' compares size, mtime and inode (for large binaries). */
  mode: 'content' | 'stat';
}

export function fingerprint(f: WatchedFile): string {
  try {
    if (f.mode === 'stat') {
      const st = fs.statSync(f.path);
      return `${st.size}:${st.mtimeMs}:${st.ino}`;
    }
    return createHash('sha256').update(fs.readFileSync(f.path)).digest('hex');
  } catch {
    return 'missing';
  }
}

export class FileWatcher {
  private watchers: fs.FSWatcher[] = [];
  private prints = new Map<string, string>();
  private timer: NodeJS.Timeout | undefined;
  private poll: NodeJS.Timeout | undefined;
  private files: WatchedFile[] = [];

  constructor(private readonly onChange: (changed: string[]) => void, private readonly opts: { debounceMs: number; pollMs?: number }) {}

  /** Replaces the watched set; the current content is the baseline (no event for it). */
  watch(files: WatchedFile[]): void {
    this.stopWatchers();
    this.files = files.filter((f) => f.path);
    this.prints = new Map(this.files.map((f) => [f.path, fingerprint(f)]));
    const dirs = new Set(this.files.map((f) => path.dirname(path.resolve(f.path))));
    for (const dir of dirs) {
      try {
        const w = fs.watch(dir, { persistent: false }, () => this.kick());
        w.on('error', () => undefined);
        this.watchers.push(w);
      } catch (err) {
        log.debug(`cannot watch ${dir} (${(err as Error).message}); polling it`);
      }
    }
    this.poll = setInterval(() => this.check(), this.opts.pollMs ?? 5000);
    this.poll.unref();
  }

  private kick(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => this.check(), this.opts.debounceMs);
    this.timer.unref();
  }

  private check(): void {
    this.timer = undefined;
    const changed: string[] = [];
    for (const f of this.files) {
      const p = fingerprint(f);
      if (p !== this.prints.get(f.path)) {
        this.prints.set(f.path, p);
        changed.push(f.path);
      }
    }
    if (changed.length) {
      log.info(`changed: ${changed.join(', ')}`);
      this.onChange(changed);
    }
  }

  private stopWatchers(): void {
    for (const w of this.watchers) w.close();
    this.watchers = [];
    if (this.poll) clearInterval(this.poll);
    this.poll = undefined;
  }

  close(): void {
    this.stopWatchers();
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

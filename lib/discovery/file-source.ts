// The file-backed config cache: reads every *.yaml, *.yml and *.json file directly in a directory, watches it, and
// applies the difference to a ConfigStore (whose handlers then fire). Bad input never reaches the store:
// - a file that does not parse or validate keeps its last good content in force;
// - a set that fails the cross checks (duplicates, references) is not applied at all; the store keeps the last
//   good set until the files are fixed.
// - a file that cannot be read (a dangling symlink, a symlink loop, a FIFO, a file above the size limit) is an issue
//   like any other: its last good content stays in force;
// - files are read and parsed one document at a time with the event loop given back in between, so the servers of
//   the same process keep answering while a large directory loads; syncs never overlap.
// Every issue is logged once, naming the file, the document and the field.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { scope } from '../log';
import type { ConfigStore } from './config-store';
import { crossCheck } from './cross-check';
import { type Config, KINDS, keyOf } from './model';
import { type ConfigIssue, DEFAULT_MAX_DOCUMENTS, formatIssue, parseConfigFileAsync } from './yaml-file';

const log = scope('discovery');

export interface FileSourceOptions {
  dir: string;
  store: ConfigStore;
  /** Quiet period after a file event before the directory is read again. */
  quietMs?: number;
  /** Full rescan interval, a safety net for missed watch events. */
  pollMs?: number;
  /** Largest file read; a larger one is an issue (DISCOVERY_MAX_FILE_BYTES). */
  maxFileBytes?: number;
  /** Most documents in one file (DISCOVERY_MAX_DOCUMENTS). */
  maxDocuments?: number;
}

export const DEFAULT_MAX_FILE_BYTES = 4 * 1024 * 1024;

export interface SyncResult {
  /** Did the store change? */
  changed: boolean;
  /** Every current issue (empty when the files on disk are all good and applied). */
  issues: ConfigIssue[];
}

interface FileState {
  mtimeMs: number;
  size: number;
  text: string;
  configs: Config[];
  issues: ConfigIssue[];
  /** Configs of the last version of this file that had no issue. */
  lastGood?: Config[];
  /** Not read (cannot be, or must not be): never reused as a cache entry. */
  unreadable?: boolean;
}

export class FileConfigSource {
  private readonly files = new Map<string, FileState>();
  private readonly opts: Required<FileSourceOptions>;
  private watcher: fs.FSWatcher | undefined;
  private timer: NodeJS.Timeout | undefined;
  private poller: NodeJS.Timeout | undefined;
  private loggedIssues = new Set<string>();
  private closed = false;
  private currentIssues: ConfigIssue[] = [];
  private chain: Promise<unknown> = Promise.resolve();
  private lastSet: { parts: (readonly Config[])[]; cross: ConfigIssue[] } | undefined;
  /** True while a set is being written to the store: readers must not snapshot it half applied. */
  applying = false;
  private queued: Promise<SyncResult> | undefined;
  /** Called after each sync that changed the store or the issue list. */
  onSync: (r: SyncResult) => void = () => {};

  constructor(opts: FileSourceOptions) {
    this.opts = {
      quietMs: 50,
      pollMs: 5000,
      maxFileBytes: DEFAULT_MAX_FILE_BYTES,
      maxDocuments: DEFAULT_MAX_DOCUMENTS,
      ...opts,
    };
  }

  get issues(): readonly ConfigIssue[] {
    return this.currentIssues;
  }

  /**
   * Reads the directory and applies it. Rejects only if the directory itself cannot be read.
   * `report: false` leaves logging to the caller (the initial load fails with all issues in one error).
   * Calls made while a sync runs share one sync that starts after it, so a burst of events costs two reads.
   */
  sync(opts: { report?: boolean } = {}): Promise<SyncResult> {
    if (this.queued) return this.queued;
    const next = this.chain.then(() => {
      this.queued = undefined;
      return this.syncOnce(opts);
    });
    this.queued = next;
    this.chain = next.catch(() => {});
    return next;
  }

  private async syncOnce(opts: { report?: boolean }): Promise<SyncResult> {
    const names = fs
      .readdirSync(this.opts.dir)
      .filter((n) => /\.(ya?ml|json)$/i.test(n) && !n.startsWith('.'))
      .sort();
    const fileIssues: ConfigIssue[] = [];
    const candidate: Config[] = [];
    const lastGoodIfApplied = new Map<string, Config[]>();
    const parts: (readonly Config[])[] = [];
    const present = new Set(names);
    for (const n of [...this.files.keys()]) if (!present.has(n)) this.files.delete(n);
    // Never push(...list): a spread passes every element as an argument, and 170,000 of them overflow the stack.
    const append = <T>(to: T[], from: readonly T[]) => {
      for (const x of from) to.push(x);
    };
    for (const name of names) {
      const st = await this.readFile(name);
      if (this.closed) return { changed: false, issues: this.currentIssues };
      if (!st) continue;
      if (st.issues.length === 0) {
        parts.push(st.configs);
        append(candidate, st.configs);
        lastGoodIfApplied.set(name, st.configs);
      } else {
        append(fileIssues, st.issues);
        if (st.lastGood) parts.push(st.lastGood);
        append(candidate, st.lastGood ?? []);
      }
    }
    // The periodic rescan usually finds every file unchanged (the same parsed arrays): then the set is the one
    // already checked and applied, and comparing 10,000 configs with the store again would be wasted work.
    const same =
      this.lastSet !== undefined &&
      this.lastSet.parts.length === parts.length &&
      parts.every((p, i) => p === this.lastSet!.parts[i]);
    const cross = same ? this.lastSet!.cross : crossCheck(candidate);
    this.lastSet = { parts, cross };
    let changed = false;
    if (cross.length === 0 && !same) {
      this.applying = true;
      try {
        changed = await this.apply(candidate);
      } finally {
        this.applying = false;
      }
      for (const [name, configs] of lastGoodIfApplied) {
        const st = this.files.get(name);
        if (st) st.lastGood = configs;
      }
    }
    const issues = [...fileIssues, ...cross];
    if (opts.report !== false) this.report(issues, cross.length > 0);
    else this.loggedIssues = new Set(issues.map(formatIssue));
    const issuesChanged = JSON.stringify(issues) !== JSON.stringify(this.currentIssues);
    this.currentIssues = issues;
    const result = { changed, issues };
    if (changed || issuesChanged) this.onSync(result);
    return result;
  }

  /** Starts watching; call after the first sync(). */
  start(): void {
    if (this.closed || this.watcher) return;
    try {
      this.watcher = fs.watch(this.opts.dir, { persistent: false }, () => this.schedule());
      this.watcher.on('error', (e) =>
        log.warn('config directory watch failed; falling back to polling', { dir: this.opts.dir, error: e.message }),
      );
    } catch (e) {
      log.warn('cannot watch the config directory; polling it instead', {
        dir: this.opts.dir,
        error: (e as Error).message,
      });
    }
    this.poller = setInterval(() => this.safeSync(), this.opts.pollMs);
    this.poller.unref();
  }

  close(): void {
    this.closed = true;
    this.watcher?.close();
    this.watcher = undefined;
    if (this.timer) clearTimeout(this.timer);
    if (this.poller) clearInterval(this.poller);
  }

  private schedule(): void {
    if (this.closed) return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => this.safeSync(), this.opts.quietMs);
    this.timer.unref();
  }

  private safeSync(): void {
    if (this.closed) return;
    this.sync().catch((e: Error) =>
      log.error('cannot read the config directory; keeping the last good config', {
        dir: this.opts.dir,
        error: e.message,
      }),
    );
  }

  private async readFile(name: string): Promise<FileState | undefined> {
    const full = path.join(this.opts.dir, name);
    const prev = this.files.get(name);
    const unreadable = (message: string): FileState => {
      // The file's last good configs stay in force until it can be read again.
      const st: FileState = {
        mtimeMs: -1,
        size: -1,
        text: '',
        configs: [],
        issues: [{ file: full, message }],
        unreadable: true,
      };
      if (prev?.lastGood) st.lastGood = prev.lastGood;
      this.files.set(name, st);
      return st;
    };
    let stat: fs.Stats;
    try {
      stat = fs.statSync(full);
    } catch (e) {
      const problem = brokenLink(full, e as NodeJS.ErrnoException);
      return problem === undefined ? undefined : unreadable(problem);
    }
    if (stat.isDirectory()) return undefined;
    // Reading a FIFO blocks until a writer comes; a device may never end.
    if (!stat.isFile()) return unreadable('is not a regular file; not read');
    const max = this.opts.maxFileBytes;
    if (stat.size > max) return unreadable(tooLarge(stat.size, max));
    if (prev && !prev.unreadable && prev.mtimeMs === stat.mtimeMs && prev.size === stat.size) return prev;
    let text: string;
    try {
      const buf = readAtMost(full, max + 1);
      if (buf.length > max) return unreadable(tooLarge(buf.length, max)); // grew since the stat
      text = buf.toString('utf8');
    } catch (e) {
      return unreadable(`cannot read: ${(e as Error).message}`);
    }
    if (prev && !prev.unreadable && prev.text === text) {
      prev.mtimeMs = stat.mtimeMs;
      prev.size = stat.size;
      return prev;
    }
    const { configs, issues } = await parseConfigFileAsync(full, text, { maxDocuments: this.opts.maxDocuments });
    const st: FileState = { mtimeMs: stat.mtimeMs, size: stat.size, text, configs, issues };
    if (prev?.lastGood) st.lastGood = prev.lastGood;
    this.files.set(name, st);
    return st;
  }

  /**
   * Applies the candidate set to the store as creates, updates and deletes, giving the event loop back every
   * few milliseconds (`applying` tells readers the store is mid-change). Nothing else writes the store meanwhile.
   */
  private async apply(candidate: readonly Config[]): Promise<boolean> {
    const store = this.opts.store;
    const want = new Map(candidate.map((c) => [keyOf(c), c]));
    let changed = false;
    let sliceStart = performance.now();
    const breathe = async () => {
      if (performance.now() - sliceStart < 10) return;
      await new Promise<void>((r) => setImmediate(r));
      sliceStart = performance.now();
    };
    for (const kind of KINDS) {
      for (const old of store.list(kind)) {
        if (!want.has(keyOf(old))) {
          store.delete(kind, old.meta.name, old.meta.namespace);
          changed = true;
          await breathe();
        }
      }
    }
    for (const c of want.values()) {
      const old = store.get(c.meta.kind, c.meta.name, c.meta.namespace);
      if (!old) {
        store.create(c);
        changed = true;
      } else if (
        !sameContent(old, c) ||
        old.meta.source?.file !== c.meta.source?.file ||
        old.meta.source?.doc !== c.meta.source?.doc
      ) {
        // A config that only moved between files is updated too, so later messages point at the right place.
        store.update({ ...c, meta: { ...c.meta, resourceVersion: old.meta.resourceVersion } });
        changed = true;
      }
      await breathe();
    }
    return changed;
  }

  private report(issues: ConfigIssue[], setRejected: boolean): void {
    const now = new Set(issues.map(formatIssue));
    for (const text of now) {
      if (!this.loggedIssues.has(text)) {
        log.error(`invalid config, keeping the last good config: ${text}`);
      }
    }
    if (setRejected && issues.length && [...now].some((t) => !this.loggedIssues.has(t))) {
      log.error('the config set was not applied because of the errors above; the last good set stays in force');
    }
    if (now.size === 0 && this.loggedIssues.size > 0)
      log.info('config errors resolved; the files on disk are in force');
    this.loggedIssues = now;
  }
}

function tooLarge(size: number, max: number): string {
  return `is ${size} bytes, above the limit of ${max} (DISCOVERY_MAX_FILE_BYTES); not read. Split it into several files or raise the limit`;
}

/** Reads up to `limit` bytes, so a file that grows after its stat cannot make the read unbounded. */
function readAtMost(file: string, limit: number): Buffer {
  const fd = fs.openSync(file, 'r');
  try {
    const buf = Buffer.allocUnsafe(Math.min(limit, 64 * 1024 * 1024));
    let off = 0;
    while (off < buf.length) {
      const n = fs.readSync(fd, buf, off, buf.length - off, off);
      if (n === 0) break;
      off += n;
    }
    return buf.subarray(0, off);
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * Why a directory entry that stat() refuses cannot be read, or undefined when it is simply gone (removed between
 * readdir and stat). A dangling symlink or a loop is an error to report, not a removed file: treating it as
 * removed deleted its services and logged "config errors resolved".
 */
function brokenLink(full: string, err: NodeJS.ErrnoException): string | undefined {
  let target: string;
  try {
    if (!fs.lstatSync(full).isSymbolicLink()) return `cannot read: ${err.message}`;
    target = fs.readlinkSync(full);
  } catch {
    return undefined;
  }
  if (err.code === 'ELOOP') return `is a symbolic link loop (-> ${target}); not read`;
  if (err.code === 'ENOENT' || err.code === 'ENOTDIR')
    return `is a symbolic link to ${target}, which does not exist; not read`;
  return `is a symbolic link to ${target}, which cannot be read: ${err.message}`;
}

function sameContent(a: Config, b: Config): boolean {
  return (
    JSON.stringify(a.spec) === JSON.stringify(b.spec) && JSON.stringify(a.meta.labels) === JSON.stringify(b.meta.labels)
  );
}

// The file-backed config cache: reads every *.yaml, *.yml and *.json file directly in a directory, watches it, and
// applies the difference to a ConfigStore (whose handlers then fire). Bad input never reaches the store:
// - a file that does not parse or validate keeps its last good content in force;
// - a set that fails the cross checks (duplicates, references) is not applied at all; the store keeps the last
//   good set until the files are fixed.
// Every issue is logged once, naming the file, the document and the field.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { scope } from '../log';
import type { ConfigStore } from './config-store';
import { crossCheck } from './cross-check';
import { type Config, KINDS, keyOf } from './model';
import { type ConfigIssue, formatIssue, parseConfigFile } from './yaml-file';

const log = scope('discovery');

export interface FileSourceOptions {
  dir: string;
  store: ConfigStore;
  /** Quiet period after a file event before the directory is read again. */
  quietMs?: number;
  /** Full rescan interval, a safety net for missed watch events. */
  pollMs?: number;
}

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
  /** Called after each sync that changed the store or the issue list. */
  onSync: (r: SyncResult) => void = () => {};

  constructor(opts: FileSourceOptions) {
    this.opts = { quietMs: 50, pollMs: 5000, ...opts };
  }

  get issues(): readonly ConfigIssue[] {
    return this.currentIssues;
  }

  /**
   * Reads the directory and applies it. Throws only if the directory itself cannot be read.
   * `report: false` leaves logging to the caller (the initial load fails with all issues in one error).
   */
  sync(opts: { report?: boolean } = {}): SyncResult {
    const names = fs.readdirSync(this.opts.dir).filter((n) => /\.(ya?ml|json)$/i.test(n) && !n.startsWith('.')).sort();
    const fileIssues: ConfigIssue[] = [];
    const candidate: Config[] = [];
    const lastGoodIfApplied = new Map<string, Config[]>();
    for (const n of [...this.files.keys()]) if (!names.includes(n)) this.files.delete(n);
    for (const name of names) {
      const st = this.readFile(name);
      if (!st) continue;
      if (st.issues.length === 0) {
        candidate.push(...st.configs);
        lastGoodIfApplied.set(name, st.configs);
      } else {
        fileIssues.push(...st.issues);
        candidate.push(...(st.lastGood ?? []));
      }
    }
    const cross = crossCheck(candidate);
    let changed = false;
    if (cross.length === 0) {
      changed = this.apply(candidate);
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
      this.watcher.on('error', (e) => log.warn('config directory watch failed; falling back to polling', { dir: this.opts.dir, error: e.message }));
    } catch (e) {
      log.warn('cannot watch the config directory; polling it instead', { dir: this.opts.dir, error: (e as Error).message });
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
    try {
      this.sync();
    } catch (e) {
      log.error('cannot read the config directory; keeping the last good config', { dir: this.opts.dir, error: (e as Error).message });
    }
  }

  private readFile(name: string): FileState | undefined {
    const full = path.join(this.opts.dir, name);
    let stat: fs.Stats;
    try {
      stat = fs.statSync(full);
      if (!stat.isFile()) return undefined;
    } catch {
      return undefined; // removed between readdir and stat
    }
    const prev = this.files.get(name);
    if (prev && prev.mtimeMs === stat.mtimeMs && prev.size === stat.size) return prev;
    let text: string;
    try {
      text = fs.readFileSync(full, 'utf8');
    } catch (e) {
      const st: FileState = { mtimeMs: stat.mtimeMs, size: stat.size, text: '', configs: [], issues: [{ file: full, message: `cannot read: ${(e as Error).message}` }] };
      if (prev?.lastGood) st.lastGood = prev.lastGood;
      this.files.set(name, st);
      return st;
    }
    if (prev && prev.text === text) {
      prev.mtimeMs = stat.mtimeMs;
      prev.size = stat.size;
      return prev;
    }
    const { configs, issues } = parseConfigFile(full, text);
    const st: FileState = { mtimeMs: stat.mtimeMs, size: stat.size, text, configs, issues };
    if (prev?.lastGood) st.lastGood = prev.lastGood;
    this.files.set(name, st);
    return st;
  }

  /** Applies the candidate set to the store as creates, updates and deletes. */
  private apply(candidate: readonly Config[]): boolean {
    const store = this.opts.store;
    const want = new Map(candidate.map((c) => [keyOf(c), c]));
    let changed = false;
    for (const kind of KINDS) {
      for (const old of store.list(kind)) {
        if (!want.has(keyOf(old))) {
          store.delete(kind, old.meta.name, old.meta.namespace);
          changed = true;
        }
      }
    }
    for (const c of want.values()) {
      const old = store.get(c.meta.kind, c.meta.name, c.meta.namespace);
      if (!old) {
        store.create(c);
        changed = true;
      } else if (!sameContent(old, c) || old.meta.source?.file !== c.meta.source?.file || old.meta.source?.doc !== c.meta.source?.doc) {
        // A config that only moved between files is updated too, so later messages point at the right place.
        store.update({ ...c, meta: { ...c.meta, resourceVersion: old.meta.resourceVersion } });
        changed = true;
      }
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
    if (now.size === 0 && this.loggedIssues.size > 0) log.info('config errors resolved; the files on disk are in force');
    this.loggedIssues = now;
  }
}

function sameContent(a: Config, b: Config): boolean {
  return JSON.stringify(a.spec) === JSON.stringify(b.spec) && JSON.stringify(a.meta.labels) === JSON.stringify(b.meta.labels);
}

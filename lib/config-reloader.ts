// Keeps the desired config current: watches every file that fed the config and the bootstrap (and the Envoy
// binary), and takes SIGHUP as "hot-restart now". Each change re-resolves flags + env + files; a result that
// fails validation is logged and the last good config stays in force.

import type { Component } from './component';
import { closedSignal } from './component';
import type { Flags } from './config';
import type { Env } from './env';
import * as envs from './env';
import { errorMessage } from './errors';
import { FileWatcher, referencedFiles } from './file-watcher';
import { scope } from './log';
import { resolveAll, type Resolved } from './resolve';

const log = scope('agent');

export class ConfigReloader implements Component {
  readonly name = 'config watcher';
  private readonly signal = closedSignal();
  readonly closed = this.signal.closed;
  private readonly watcher: FileWatcher;
  private generation = 0;
  private started = false;

  constructor(
    private readonly o: {
      flags: Flags;
      env: Env;
      resolved: Resolved;
      /** A newly resolved config; `generation` is bumped by SIGHUP to force a new epoch. */
      onChange: (r: Resolved, generation: number) => void;
    },
  ) {
    this.watcher = new FileWatcher(() => this.refresh('file change'), {
      debounceMs: envs.FILE_DEBOUNCE_DURATION.get(o.env),
    });
  }

  private watched(r: Resolved) {
    return [
      ...[...new Set([...r.inputs, ...referencedFiles(r.bootstrap)])].map((p) => ({
        path: p,
        mode: 'content' as const,
      })),
      { path: r.cfg.proxy.binaryPath, mode: 'stat' as const },
    ];
  }

  private refresh(why: string): void {
    try {
      const r = resolveAll(this.o.flags, this.o.env, this.o.resolved.cfg.sockets);
      if (r.cfg.proxy.statusPort !== this.o.resolved.cfg.proxy.statusPort)
        log.warn('a new statusPort takes effect only when the agent restarts');
      this.watcher.watch(this.watched(r));
      this.o.onChange(r, this.generation);
    } catch (err) {
      log.error(`${why}: new config not applied, keeping the last good one: ${errorMessage(err)}`);
    }
  }

  private readonly onHup = () => {
    this.generation++;
    log.info('SIGHUP: hot-restarting Envoy');
    this.refresh('SIGHUP');
  };

  async start(): Promise<void> {
    if (this.started) return;
    this.started = true;
    this.watcher.watch(this.watched(this.o.resolved));
    process.on('SIGHUP', this.onHup);
  }

  async close(): Promise<void> {
    this.watcher.close();
    process.off('SIGHUP', this.onHup);
    this.signal.resolve();
  }
}

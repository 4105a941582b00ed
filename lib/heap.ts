// The agent's V8 heap: flags applied at run time, and one compacting collection once start-up is over.
// The flags that only count when the heap is created (--max-semi-space-size=1: new space at 1 MiB) are built into the
// executable as the SEA's execArgv (scripts/build.sh; Node >= 24 reads it, and the code cache or startup snapshot
// is made under the same flags). PILOT_AGENT_V8_FLAGS adds run-time settable flags on top, set here from inside
// before the work starts; none by default. A flag V8 did not start with changes its flag hash, and V8 then rejects
// the code cache of every Node built-in compiled after it (77 of them in a sidecar's start, compiled from source):
// the former default, --semi-space-growth-factor=1 (for a runtime that ignores execArgv, Node 20), cost that.

import type * as v8type from 'node:v8';
import { scope } from './log';

const log = scope('heap');

// node:v8 loads on first use (with its internal modules, a few ms of every start): by default no flag is set, and
// the GC below runs after start-up. require, not import(): a single executable has no dynamic import of built-ins.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const v8 = () => require('node:v8') as typeof v8type;

export function applyV8Flags(flags: string): void {
  if (flags.trim()) v8().setFlagsFromString(flags.trim());
}

let collected = false;

/**
 * A full GC after start-up: what only start-up needed (parsers, descriptors, module initialisers) is released.
 * The "last-resort" flavour is V8's memory-reducing collection (several compacting passes that also give the freed
 * pages back), what the memory reducer would do on its own some 8 s after start; a plain full GC left them pooled:
 * idle RssAnon 26.1 -> 22.2 MiB with a CA on Node 24 (BENCHMARKS.md, issue 22). A runtime whose gc() does not know
 * the option does a regular full GC.
 */
export function collectStartupGarbage(): void {
  if (collected) return;
  collected = true;
  try {
    // Loaded here, not at top level: node:vm is not vouched for in the startup snapshot. require, not import():
    // a single executable has no dynamic-import callback for built-ins.
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    const vm = require('node:vm') as typeof import('node:vm');
    v8().setFlagsFromString('--expose-gc');
    const gc = vm.runInNewContext('gc') as ((o?: object) => void) | undefined;
    v8().setFlagsFromString('--no-expose-gc');
    if (typeof gc !== 'function') return;
    const before = process.memoryUsage().heapUsed;
    const t0 = performance.now();
    gc({ type: 'major', execution: 'sync', flavor: 'last-resort' });
    const ms = (performance.now() - t0).toFixed(1);
    const mib = (n: number) => (n / 1048576).toFixed(1);
    const after = process.memoryUsage().heapUsed;
    log.debug(`start-up garbage collected in ${ms} ms: heap ${mib(before)} -> ${mib(after)} MiB`);
  } catch (err) {
    log.debug(`no start-up collection: ${(err as Error).message}`);
  }
}

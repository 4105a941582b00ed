// Profiling endpoints on the status port, the counterpart of Go's /debug/pprof (Istio's `--profiling`, on by
// default), answered to loopback peers only:
//   /debug/pprof/                   index
//   /debug/pprof/heap?seconds=N     live allocations sampled over N seconds, default 2 (.heapprofile)
//   /debug/pprof/allocs?seconds=N   every allocation sampled over N seconds, default 30 (.heapprofile)
//   /debug/pprof/profile?seconds=N  a CPU profile over N seconds, default 30 (.cpuprofile)
//   /debug/pprof/heapsnapshot       a full V8 heap snapshot, only with PILOT_AGENT_HEAP_SNAPSHOTS=true
//   /debug/pprof/cmdline            the agent's command line
// The formats are V8's, not pprof's: Node has no pprof encoder, and DevTools, VS Code and speedscope read them.
// "Loopback only" is every local uid: a profile must hold no memory contents. Go's heap profile is an allocation
// profile (stacks and sizes), and so is V8's sampling heap profile; a heap snapshot holds every string (the
// workload's private key, the CA's root key) and pauses the agent while it is taken, so it is off unless the
// operator turns it on. Each profiler runs one profile at a time; a second request gets 429 at once.

import type * as http from 'node:http';
import { Session } from 'node:inspector/promises';
import * as v8 from 'node:v8';
import { closedSignal, type Component, type StatusRoute } from './component';
import { scope } from './log';
import type { Reply } from './component';

const log = scope('profiling');

const MAX_SECONDS = 600;
const INDEX = `/debug/pprof/: profiles of the agent (V8 formats, open in Chrome DevTools or speedscope)

heap?seconds=N    live allocations sampled over N seconds, default 2 (.heapprofile; stacks and sizes only)
allocs?seconds=N  every allocation sampled over N seconds, default 30 (.heapprofile)
profile?seconds=N CPU profile over N seconds, default 30 (.cpuprofile)
heapsnapshot      full V8 heap snapshot (.heapsnapshot), only with PILOT_AGENT_HEAP_SNAPSHOTS=true
cmdline           the agent's command line
`;

function seconds(req: http.IncomingMessage, def: number): number | string {
  const raw = new URL(req.url ?? '/', 'http://x').searchParams.get('seconds');
  if (raw === null || raw === '') return def;
  const n = Number(raw);
  if (!Number.isFinite(n) || n <= 0 || n > MAX_SECONDS)
    return `seconds must be a number in (0, ${MAX_SECONDS}], got ${JSON.stringify(raw)}`;
  return n;
}

/** V8's profilers: one CPU profiler, one sampling heap profiler (heap and allocs share it), one snapshot writer. */
type Profiler = 'cpu' | 'sampling heap' | 'snapshot';

const busy = (what: string): Reply => ({
  status: 429,
  body: `a ${what} is already running; try again when it ends\n`,
  headers: { 'retry-after': '5' },
});

export interface ProfilingOptions {
  /** Serve full heap snapshots (PILOT_AGENT_HEAP_SNAPSHOTS): they contain every key the agent holds. */
  heapSnapshots?: boolean;
}

export class Profiling implements Component {
  readonly name = 'profiling';
  private readonly sig = closedSignal();
  readonly closed = this.sig.closed;
  /** The profile running on each profiler, and how to end it early. */
  private readonly running = new Map<Profiler, { what: string; stop: () => void }>();
  private stopped = false;

  constructor(private readonly opts: ProfilingOptions = {}) {}

  async start(): Promise<void> {}

  async close(): Promise<void> {
    this.stopped = true;
    for (const r of this.running.values()) r.stop();
    this.sig.resolve();
  }

  routes(): StatusRoute[] {
    const r = (path: string, handler: (req: http.IncomingMessage) => Promise<Reply> | Reply): StatusRoute => ({
      method: 'GET',
      path,
      handler,
      localOnly: true,
    });
    return [
      r('/debug/pprof/', (req) => {
        const path = (req.url ?? '/').split('?')[0]!;
        return path === '/debug/pprof/'
          ? { status: 200, body: INDEX }
          : { status: 404, body: `unknown profile ${path.slice('/debug/pprof/'.length)}\n\n${INDEX}` };
      }),
      r('/debug/pprof/cmdline', () => ({ status: 200, body: process.argv.join('\0') })),
      r('/debug/pprof/heap', (req) => this.sampled(req, 'heap profile')),
      r('/debug/pprof/heapsnapshot', () => this.snapshot()),
      r('/debug/pprof/profile', (req) => this.sampled(req, 'CPU profile')),
      r('/debug/pprof/allocs', (req) => this.sampled(req, 'allocation profile')),
    ];
  }

  private async snapshot(): Promise<Reply> {
    if (!this.opts.heapSnapshots) {
      const body =
        'heap snapshots hold every key the agent has and are off; PILOT_AGENT_HEAP_SNAPSHOTS=true turns them on\n';
      return { status: 403, body };
    }
    if (this.stopped) return { status: 503, body: 'the agent is shutting down\n' };
    if (this.running.has('snapshot')) return busy('heap snapshot');
    this.running.set('snapshot', { what: 'heap snapshot', stop: () => {} });
    try {
      const t0 = Date.now();
      const chunks: Buffer[] = [];
      for await (const c of v8.getHeapSnapshot()) chunks.push(c as Buffer);
      const body = Buffer.concat(chunks);
      log.info(`heap snapshot taken: ${body.length} bytes in ${Date.now() - t0} ms`);
      return { status: 200, body, contentType: 'application/json' };
    } finally {
      this.running.delete('snapshot');
    }
  }

  private async sampled(
    req: http.IncomingMessage,
    what: 'CPU profile' | 'allocation profile' | 'heap profile',
  ): Promise<Reply> {
    const secs = seconds(req, what === 'heap profile' ? 2 : 30);
    if (typeof secs === 'string') return { status: 400, body: secs + '\n' };
    if (this.stopped) return { status: 503, body: 'the agent is shutting down\n' };
    const profiler: Profiler = what === 'CPU profile' ? 'cpu' : 'sampling heap';
    const other = this.running.get(profiler);
    if (other) return busy(other.what);
    let wake!: () => void;
    const slept = new Promise<void>((r) => (wake = r));
    const timer = setTimeout(wake, secs * 1000);
    this.running.set(profiler, { what, stop: wake });
    const session = new Session();
    // A scraper that gives up ends the profile early.
    req.socket.once('close', wake);
    try {
      session.connect();
      log.info(`${what} for ${secs} s started`);
      let profile: unknown;
      if (profiler === 'cpu') {
        await session.post('Profiler.enable');
        await session.post('Profiler.start');
        await slept;
        profile = (await session.post('Profiler.stop')).profile;
      } else {
        await session.post('HeapProfiler.enable');
        // allocs counts every allocation, as Go's allocs profile; heap only what is still live at the end (in use).
        const all = what === 'allocation profile';
        await session.post('HeapProfiler.startSampling', {
          samplingInterval: 32 * 1024,
          includeObjectsCollectedByMajorGC: all,
          includeObjectsCollectedByMinorGC: all,
        });
        await slept;
        profile = (await session.post('HeapProfiler.stopSampling')).profile;
      }
      const body = JSON.stringify(profile);
      log.info(`${what} done: ${body.length} bytes`);
      return { status: 200, body, contentType: 'application/json' };
    } finally {
      clearTimeout(timer);
      req.socket.off('close', wake);
      session.disconnect();
      this.running.delete(profiler);
    }
  }
}

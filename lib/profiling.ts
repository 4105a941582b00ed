// Profiling endpoints on the status port, the counterpart of Go's /debug/pprof (Istio's `--profiling`, on by
// default), answered to loopback peers only:
//   /debug/pprof/                 index
//   /debug/pprof/heap             a V8 heap snapshot (.heapsnapshot; open in Chrome DevTools > Memory)
//   /debug/pprof/profile?seconds=N  a CPU profile over N seconds, default 30 (.cpuprofile; DevTools > Performance)
//   /debug/pprof/allocs?seconds=N   a sampling heap profile of allocations over N seconds (.heapprofile)
//   /debug/pprof/cmdline          the agent's command line
// The formats are V8's, not pprof's: Node has no pprof encoder, and DevTools, VS Code and speedscope read them.
// Taking a heap snapshot pauses the agent for as long as it takes (about a second per 100 MB of heap), as in Go.

import type * as http from 'node:http';
import { Session } from 'node:inspector/promises';
import * as v8 from 'node:v8';
import { closedSignal, type Component, type StatusRoute } from './component';
import { scope } from './log';
import type { Reply } from './status-server';

const log = scope('profiling');

const MAX_SECONDS = 600;
const INDEX = `/debug/pprof/: profiles of the agent (V8 formats, open in Chrome DevTools or speedscope)

heap              V8 heap snapshot (.heapsnapshot)
profile?seconds=N CPU profile over N seconds, default 30 (.cpuprofile)
allocs?seconds=N  sampling heap profile of allocations over N seconds, default 30 (.heapprofile)
cmdline           the agent's command line
`;

function seconds(req: http.IncomingMessage): number | string {
  const raw = new URL(req.url ?? '/', 'http://x').searchParams.get('seconds');
  if (raw === null || raw === '') return 30;
  const n = Number(raw);
  if (!Number.isFinite(n) || n <= 0 || n > MAX_SECONDS) return `seconds must be a number in (0, ${MAX_SECONDS}], got ${JSON.stringify(raw)}`;
  return n;
}

export class Profiling implements Component {
  readonly name = 'profiling';
  private readonly sig = closedSignal();
  readonly closed = this.sig.closed;
  /** The one running profile (V8 has one CPU profiler per isolate worth sharing), and how to end it early. */
  private running: { what: string; stop: () => void } | undefined;
  private stopped = false;

  async start(): Promise<void> {}

  async close(): Promise<void> {
    this.stopped = true;
    this.running?.stop();
    this.sig.resolve();
  }

  routes(): StatusRoute[] {
    const r = (path: string, handler: (req: http.IncomingMessage) => Promise<Reply> | Reply): StatusRoute => ({ method: 'GET', path, handler, localOnly: true });
    return [
      r('/debug/pprof/', (req) => {
        const path = (req.url ?? '/').split('?')[0]!;
        return path === '/debug/pprof/' ? { status: 200, body: INDEX } : { status: 404, body: `unknown profile ${path.slice('/debug/pprof/'.length)}\n\n${INDEX}` };
      }),
      r('/debug/pprof/cmdline', () => ({ status: 200, body: process.argv.join('\0') })),
      r('/debug/pprof/heap', () => this.heap()),
      r('/debug/pprof/profile', (req) => this.sampled(req, 'CPU profile')),
      r('/debug/pprof/allocs', (req) => this.sampled(req, 'allocation profile')),
    ];
  }

  private async heap(): Promise<Reply> {
    const t0 = Date.now();
    const chunks: Buffer[] = [];
    for await (const c of v8.getHeapSnapshot()) chunks.push(c as Buffer);
    const body = Buffer.concat(chunks);
    log.info(`heap snapshot taken: ${body.length} bytes in ${Date.now() - t0} ms`);
    return { status: 200, body, contentType: 'application/json' };
  }

  private async sampled(req: http.IncomingMessage, what: 'CPU profile' | 'allocation profile'): Promise<Reply> {
    const secs = seconds(req);
    if (typeof secs === 'string') return { status: 400, body: secs + '\n' };
    if (this.stopped) return { status: 503, body: 'the agent is shutting down\n' };
    if (this.running) return { status: 409, body: `a ${this.running.what} is already running; try again when it ends\n` };
    const session = new Session();
    let wake!: () => void;
    const slept = new Promise<void>((r) => (wake = r));
    const timer = setTimeout(wake, secs * 1000);
    this.running = { what, stop: wake };
    // A scraper that gives up ends the profile early.
    req.socket.once('close', wake);
    try {
      session.connect();
      log.info(`${what} for ${secs} s started`);
      let profile: unknown;
      if (what === 'CPU profile') {
        await session.post('Profiler.enable');
        await session.post('Profiler.start');
        await slept;
        profile = (await session.post('Profiler.stop')).profile;
      } else {
        await session.post('HeapProfiler.enable');
        // Every allocation counts, as Go's allocs profile, not only what is still live at the end.
        await session.post('HeapProfiler.startSampling', { samplingInterval: 32 * 1024, includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: true });
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
      this.running = undefined;
    }
  }
}

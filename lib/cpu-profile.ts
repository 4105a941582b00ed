// A CPU profile of the agent from its first line to its exit (PILOT_AGENT_CPU_PROFILE=<file>): a single executable
// cannot take Node's --cpu-prof, and start-up work is what issue 16 measures. The file opens in Chrome DevTools or
// any .cpuprofile viewer. Diagnostics only: the inspector session costs start-up time of its own.

import * as fs from 'node:fs';

export function startCpuProfile(file: string): void {
  // require, not import: loaded only when asked for, and a single executable has no dynamic import of built-ins.
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const inspector = require('node:inspector') as typeof import('node:inspector');
  const session = new inspector.Session();
  session.connect();
  const startedMs = performance.now();
  session.post('Profiler.enable');
  session.post('Profiler.setSamplingInterval', { interval: 200 });
  session.post('Profiler.start');
  // On the main thread the inspector answers synchronously, so the profile can be written in an exit handler.
  process.once('exit', () => {
    session.post('Profiler.stop', (err, r) => {
      if (err) return;
      fs.writeFileSync(file, JSON.stringify({ ...r.profile, processStartOffsetMs: startedMs }));
    });
  });
}

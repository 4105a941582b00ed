// A process's memory as the benchmarks report it: VmRSS and RssAnon (/proc/<pid>/status) and PSS
// (/proc/<pid>/smaps_rollup: file-backed pages shared with other processes count by share, so for pods of one image
// on a node it is what each pod costs). KiB.

import * as fs from 'node:fs';

export interface ProcMem { rss: number; anon: number; pss: number }

export function procMemKiB(pid: number | 'self'): ProcMem {
  const kb = (s: string, k: string) => Number(new RegExp(`^${k}:\\s+(\\d+)`, 'm').exec(s)?.[1] ?? NaN);
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const rollup = fs.readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8');
  return { rss: kb(status, 'VmRSS'), anon: kb(status, 'RssAnon'), pss: kb(rollup, 'Pss') };
}

/** `VmRSS 64.4 MiB, RssAnon 20.3 MiB, PSS 59.9 MiB` */
export const formatMem = (m: ProcMem) =>
  `VmRSS ${(m.rss / 1024).toFixed(1)} MiB, RssAnon ${(m.anon / 1024).toFixed(1)} MiB, PSS ${(m.pss / 1024).toFixed(1)} MiB`;

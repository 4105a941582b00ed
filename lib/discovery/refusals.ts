// What the discovery server refuses from its peers (streams it does not authenticate, health reports it does not
// take): every refusal is counted, and each distinct reason is logged once, so a peer that keeps trying cannot
// flood the log. The reason names the proxy and what was wrong, never a token.

import { scope } from '../log';

const log = scope('discovery');
// Distinct reasons logged; past this, refusals are only counted.
const MAX_LOGGED = 1000;

export type RefusalKind = 'xds_stream' | 'health_report';

export class Refusals {
  readonly counts: Record<RefusalKind, number> = { xds_stream: 0, health_report: 0 };
  private readonly logged = new Set<string>();

  refuse(kind: RefusalKind, reason: string, fields: Record<string, unknown> = {}): void {
    this.counts[kind]++;
    const key = `${kind}|${reason}`;
    if (this.logged.has(key) || this.logged.size >= MAX_LOGGED) return;
    this.logged.add(key);
    const what = kind === 'xds_stream' ? 'refused an xDS stream' : 'ignored a health report';
    log.warn(`${what}: ${reason} (each reason is logged once, every refusal counted)`, fields);
  }
}

// Health events from proxies (istio.v1.HealthInformation requests sent by the agent's health checker): as istiod
// does, the event applies to the WorkloadEntry named by the proxy's WORKLOAD_ENTRY metadata, in the proxy's
// namespace. An unhealthy entry's endpoints are left out of every service it backs (as Istio leaves unhealthy
// endpoints out of EDS) until its proxy reports it healthy again. The state outlives the proxy's connection, so a
// reconnecting agent that re-sends it changes nothing.
//
// Withdrawing endpoints is control over every other proxy's traffic, so an event is taken only from the entry's own
// proxy: authenticated (./xds-auth.ts) as the entry's namespace and service account (unset: `default`, the identity
// such a workload gets), and, when the entry's address is an IP, claiming that IP (node id or INSTANCE_IPS; the
// stream is local, so there is no peer address to compare). Anything else is ignored, counted and logged once.

import * as net from 'node:net';
import { scope } from '../log';
import type { ConfigStoreCache } from './config-store';
import type { Config, WorkloadEntrySpec } from './model';
import type { Proxy } from './proxy';
import type { Refusals } from './refusals';
import type { ServiceEntryRegistry } from './registry';

const log = scope('discovery');

export interface HealthReport {
  workloadEntry: string;
  proxy: string;
  healthy: boolean;
  message: string;
  at: string;
}

export class WorkloadHealth {
  private readonly reports = new Map<string, HealthReport>();

  constructor(
    private readonly registry: ServiceEntryRegistry,
    private readonly store: ConfigStoreCache,
    private readonly refusals: Refusals,
  ) {}

  report(proxy: Proxy, error: { message?: string } | undefined): void {
    const why = this.refusal(proxy);
    if (why) return this.refusals.refuse('health_report', why, { proxy: proxy.id });
    const healthy = !error;
    const key = `${proxy.namespace}/${proxy.workloadEntry}`;
    const message = error?.message ?? '';
    this.reports.set(key, { workloadEntry: key, proxy: proxy.id, healthy, message, at: new Date().toISOString() });
    if (!this.registry.setWorkloadHealthy(proxy.namespace, proxy.workloadEntry!, healthy)) return;
    if (healthy) log.info(`WorkloadEntry ${key} is healthy again: its endpoints are back`, { proxy: proxy.id });
    else
      log.warn(`WorkloadEntry ${key} is unhealthy: its endpoints are withdrawn`, {
        proxy: proxy.id,
        reason: message,
      });
  }

  /** Why this proxy may not report for the entry it names; undefined when it may. */
  private refusal(proxy: Proxy): string | undefined {
    if (!proxy.workloadEntry) return `proxy ${proxy.id} has no WORKLOAD_ENTRY metadata: it names no WorkloadEntry`;
    const key = `${proxy.namespace}/${proxy.workloadEntry}`;
    const id = proxy.identity;
    if (!id) {
      const why = 'without authenticating (no token of ca/identities on its stream)';
      return `proxy ${proxy.id} reports for WorkloadEntry ${key} ${why}`;
    }
    const we = this.store.get('WorkloadEntry', proxy.workloadEntry, proxy.namespace) as
      Config<WorkloadEntrySpec> | undefined;
    if (!we) return `proxy ${proxy.id} reports for WorkloadEntry ${key}, which does not exist`;
    const sa = we.spec.serviceAccount || 'default';
    if (id.namespace !== we.meta.namespace || id.serviceAccount !== sa) {
      const as = `${id.namespace}/${id.serviceAccount}`;
      return `proxy ${proxy.id} is authenticated as ${as}; WorkloadEntry ${key} runs as ${we.meta.namespace}/${sa}`;
    }
    const address = we.spec.address;
    if (address && net.isIP(address) && !proxy.ips.includes(address)) {
      return `proxy ${proxy.id} claims ${proxy.ips.join(', ') || 'no address'}; WorkloadEntry ${key} is at ${address}`;
    }
    return undefined;
  }

  /** For the status page: the last report per WorkloadEntry. */
  status(): HealthReport[] {
    return [...this.reports.values()];
  }
}

// Health events from proxies (istio.v1.HealthInformation requests sent by the agent's health checker): as istiod
// does, the event applies to the WorkloadEntry named by the proxy's WORKLOAD_ENTRY metadata, in the proxy's
// namespace. An unhealthy entry's endpoints are left out of every service it backs (as Istio leaves unhealthy
// endpoints out of EDS) until its proxy reports it healthy again. The state outlives the proxy's connection, so a
// reconnecting agent that re-sends it changes nothing.

import { scope } from '../log';
import type { ConfigStoreCache } from './config-store';
import type { Proxy } from './proxy';
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

  constructor(private readonly registry: ServiceEntryRegistry, private readonly store: ConfigStoreCache) {}

  report(proxy: Proxy, error: { message?: string } | undefined): void {
    if (!proxy.workloadEntry) {
      log.warn('health event from a proxy without WORKLOAD_ENTRY metadata ignored: it names no WorkloadEntry', { proxy: proxy.id });
      return;
    }
    const healthy = !error;
    const key = `${proxy.namespace}/${proxy.workloadEntry}`;
    this.reports.set(key, { workloadEntry: key, proxy: proxy.id, healthy, message: error?.message ?? '', at: new Date().toISOString() });
    const known = this.store.get('WorkloadEntry', proxy.workloadEntry, proxy.namespace) !== undefined;
    if (!this.registry.setWorkloadHealthy(proxy.namespace, proxy.workloadEntry, healthy)) return;
    if (!known) log.warn(`health event for WorkloadEntry ${key}, which does not exist: it applies when the entry appears`, { proxy: proxy.id });
    if (healthy) log.info(`WorkloadEntry ${key} is healthy again: its endpoints are back`, { proxy: proxy.id });
    else log.warn(`WorkloadEntry ${key} is unhealthy: its endpoints are withdrawn`, { proxy: proxy.id, reason: error?.message ?? '' });
  }

  /** For the status page: the last report per WorkloadEntry. */
  status(): HealthReport[] {
    return [...this.reports.values()];
  }
}

// The service registry fed by ServiceEntry and WorkloadEntry configs: ServiceDiscovery answers what services and
// instances exist, the Controller side turns config events into service and instance events for its handlers.
// Work per event is proportional to the ServiceEntry it touches, so loading 10,000 services stays linear.

import type { ConfigStoreCache } from './config-store';
import {
  type Config,
  configKey,
  type Event,
  instanceKey,
  keyOf,
  labelsMatch,
  type Service,
  type ServiceEntrySpec,
  type ServiceInstance,
  type WorkloadEntrySpec,
} from './model';

export interface ServiceDiscovery {
  services(): Service[];
  getService(hostname: string): Service | undefined;
  /** Instances of a service port. */
  instances(hostname: string, port: number): readonly ServiceInstance[];
}

export type ServiceHandler = (svc: Service, event: Event) => void;
export type InstanceHandler = (inst: ServiceInstance, event: Event) => void;

export interface Controller {
  appendServiceHandler(h: ServiceHandler): void;
  appendInstanceHandler(h: InstanceHandler): void;
  /** Subscribes to the store and loads what it already holds; handlers appended before run() see everything. */
  run(): void;
}

export class ServiceEntryRegistry implements ServiceDiscovery, Controller {
  private readonly byHost = new Map<string, Service>();
  /** ServiceEntry key -> its instances by instance key. */
  private readonly instancesBySe = new Map<string, Map<string, ServiceInstance>>();
  /** `host|port` -> instances, rebuilt per ServiceEntry change. */
  private readonly byHostPort = new Map<string, ServiceInstance[]>();
  private readonly serviceHandlers: ServiceHandler[] = [];
  private readonly instanceHandlers: InstanceHandler[] = [];
  private running = false;
  /** WorkloadEntry keys whose proxy reported them unhealthy: their endpoints are left out. */
  private readonly unhealthy = new Set<string>();

  constructor(private readonly store: ConfigStoreCache) {}

  services(): Service[] {
    return [...this.byHost.values()];
  }

  getService(hostname: string): Service | undefined {
    return this.byHost.get(hostname);
  }

  instances(hostname: string, port: number): readonly ServiceInstance[] {
    return this.byHostPort.get(`${hostname}|${port}`) ?? [];
  }

  appendServiceHandler(h: ServiceHandler): void {
    this.serviceHandlers.push(h);
  }

  appendInstanceHandler(h: InstanceHandler): void {
    this.instanceHandlers.push(h);
  }

  run(): void {
    if (this.running) return;
    this.running = true;
    this.store.registerEventHandler('ServiceEntry', (old, cur) =>
      this.onServiceEntry(old as Config<ServiceEntrySpec> | undefined, cur as Config<ServiceEntrySpec> | undefined),
    );
    this.store.registerEventHandler('WorkloadEntry', (old, cur) =>
      this.onWorkloadEntry(old as Config<WorkloadEntrySpec> | undefined, cur as Config<WorkloadEntrySpec> | undefined),
    );
    for (const se of this.store.list('ServiceEntry')) this.onServiceEntry(undefined, se as Config<ServiceEntrySpec>);
  }

  private onServiceEntry(old: Config<ServiceEntrySpec> | undefined, cur: Config<ServiceEntrySpec> | undefined): void {
    const key = keyOf((cur ?? old)!);
    const newServices = new Map<string, Service>();
    if (cur) {
      for (const h of cur.spec.hosts) {
        newServices.set(
          h,
          Object.freeze({
            hostname: h,
            namespace: cur.meta.namespace,
            addresses: cur.spec.addresses ?? [],
            ports: cur.spec.ports,
            resolution: cur.spec.resolution,
            location: cur.spec.location,
            ...(cur.spec.exportTo ? { exportTo: Object.freeze([...cur.spec.exportTo]) } : {}),
            source: key,
          }),
        );
      }
    }
    for (const h of old?.spec.hosts ?? []) {
      const svc = this.byHost.get(h);
      if (svc && svc.source === key && !newServices.has(h)) {
        this.byHost.delete(h);
        this.emitService(svc, 'delete');
      }
    }
    for (const [h, svc] of newServices) {
      const prev = this.byHost.get(h);
      if (prev && prev.source !== key) continue; // another ServiceEntry owns this host; the cross check rejects that
      if (!prev) {
        this.byHost.set(h, svc);
        this.emitService(svc, 'add');
      } else if (JSON.stringify(prev) !== JSON.stringify(svc)) {
        this.byHost.set(h, svc);
        this.emitService(svc, 'update');
      } // else keep the old object: resources cached on it stay valid
    }
    this.refreshInstances(key, cur);
  }

  /** A WorkloadEntry's proxy reported its health: when it changes, its endpoints leave or rejoin its services. */
  setWorkloadHealthy(namespace: string, name: string, healthy: boolean): boolean {
    const key = configKey('WorkloadEntry', namespace, name);
    if (healthy !== this.unhealthy.has(key)) return false;
    if (healthy) this.unhealthy.delete(key);
    else this.unhealthy.add(key);
    const we = this.store.get('WorkloadEntry', name, namespace) as Config<WorkloadEntrySpec> | undefined;
    if (we) this.onWorkloadEntry(we, we);
    return true;
  }

  private onWorkloadEntry(
    old: Config<WorkloadEntrySpec> | undefined,
    cur: Config<WorkloadEntrySpec> | undefined,
  ): void {
    const ns = (cur ?? old)!.meta.namespace;
    for (const se of this.store.list('ServiceEntry', ns) as Config<ServiceEntrySpec>[]) {
      const sel = se.spec.workloadSelector;
      if (!sel) continue;
      if ((old && labelsMatch(sel, labelsOf(old))) || (cur && labelsMatch(sel, labelsOf(cur))))
        this.refreshInstances(keyOf(se), se);
    }
  }

  /** Recomputes one ServiceEntry's instances and emits the difference. */
  private refreshInstances(seKey: string, se: Config<ServiceEntrySpec> | undefined): void {
    const next = new Map<string, ServiceInstance>();
    if (se) for (const inst of this.computeInstances(se)) next.set(instanceKey(inst), inst);
    const prev = this.instancesBySe.get(seKey) ?? new Map<string, ServiceInstance>();
    if (next.size) this.instancesBySe.set(seKey, next);
    else this.instancesBySe.delete(seKey);
    const touched = new Set<string>();
    for (const [k, inst] of prev) {
      if (!next.has(k)) {
        touched.add(`${inst.hostname}|${inst.servicePort.number}`);
        this.emitInstance(inst, 'delete');
      }
    }
    for (const [k, inst] of next) {
      const p = prev.get(k);
      if (p && JSON.stringify(p) === JSON.stringify(inst)) continue;
      touched.add(`${inst.hostname}|${inst.servicePort.number}`);
      this.emitInstance(inst, p ? 'update' : 'add');
    }
    for (const hp of touched) {
      const list = [...next.values()].filter((i) => `${i.hostname}|${i.servicePort.number}` === hp);
      if (list.length) this.byHostPort.set(hp, list);
      else this.byHostPort.delete(hp);
    }
  }

  private computeInstances(se: Config<ServiceEntrySpec>): ServiceInstance[] {
    const seKey = keyOf(se);
    const out: ServiceInstance[] = [];
    const workloads: { spec: WorkloadEntrySpec; source: string; namespace: string }[] = se.spec.endpoints.map((e) => ({
      spec: e,
      source: seKey,
      namespace: se.meta.namespace,
    }));
    if (se.spec.workloadSelector) {
      for (const we of this.store.list('WorkloadEntry', se.meta.namespace) as Config<WorkloadEntrySpec>[]) {
        const key = configKey('WorkloadEntry', we.meta.namespace, we.meta.name);
        if (labelsMatch(se.spec.workloadSelector, labelsOf(we)) && !this.unhealthy.has(key)) {
          workloads.push({ spec: { ...we.spec, labels: labelsOf(we) }, source: key, namespace: we.meta.namespace });
        }
      }
    }
    for (const host of se.spec.hosts) {
      for (const port of se.spec.ports) {
        if (se.spec.resolution === 'DNS' && workloads.length === 0) {
          // DNS without endpoints: the host itself is the endpoint, as in Istio.
          out.push(
            Object.freeze({
              hostname: host,
              servicePort: port,
              address: host,
              port: port.targetPort ?? port.number,
              labels: {},
              source: seKey,
            }),
          );
          continue;
        }
        for (const w of workloads) {
          const inst: ServiceInstance = {
            hostname: host,
            servicePort: port,
            address: w.spec.address,
            port: w.spec.ports[port.name] ?? port.targetPort ?? port.number,
            labels: w.spec.labels,
            source: w.source,
          };
          if (w.spec.weight !== undefined) inst.weight = w.spec.weight;
          if (w.spec.serviceAccount) inst.identity = { namespace: w.namespace, serviceAccount: w.spec.serviceAccount };
          out.push(Object.freeze(inst));
        }
      }
    }
    return out;
  }

  private emitService(svc: Service, e: Event): void {
    for (const h of this.serviceHandlers) h(svc, e);
  }

  private emitInstance(inst: ServiceInstance, e: Event): void {
    for (const h of this.instanceHandlers) h(inst, e);
  }
}

/** A WorkloadEntry's labels: its spec labels over its metadata labels. */
function labelsOf(we: Config<WorkloadEntrySpec>): Record<string, string> {
  return { ...we.meta.labels, ...we.spec.labels };
}

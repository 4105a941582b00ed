// ConfigStore: configs keyed by kind + namespace + name, with get/list/create/update/delete and a store version,
// and handlers per kind that are called synchronously, in registration order, after each change is applied.
// Writes are validated by the caller (the file source); the store checks only identity and revisions.

import { AgentError } from '../errors';
import { configKey, type Config, type Event, type Kind, keyOf } from './model';

export type ConfigHandler = (old: Config | undefined, cur: Config | undefined, event: Event) => void;

export interface ConfigStore {
  get(kind: Kind, name: string, namespace: string): Config | undefined;
  list(kind: Kind, namespace?: string): Config[];
  /** Returns the new resourceVersion; fails if the key exists. */
  create(config: Config): string;
  /** Returns the new resourceVersion; fails if the key is missing, or if config carries a stale resourceVersion. */
  update(config: Config): string;
  delete(kind: Kind, name: string, namespace: string): void;
  /** Changes every time anything in the store changes. */
  version(): string;
}

export interface ConfigStoreCache extends ConfigStore {
  registerEventHandler(kind: Kind, handler: ConfigHandler): void;
}

export class MemoryConfigStore implements ConfigStoreCache {
  private readonly byKind = new Map<Kind, Map<string, Config>>();
  private readonly handlers = new Map<Kind, ConfigHandler[]>();
  private revision = 0;

  get(kind: Kind, name: string, namespace: string): Config | undefined {
    return this.byKind.get(kind)?.get(configKey(kind, namespace, name));
  }

  list(kind: Kind, namespace?: string): Config[] {
    const all = [...(this.byKind.get(kind)?.values() ?? [])];
    return namespace === undefined ? all : all.filter((c) => c.meta.namespace === namespace);
  }

  create(config: Config): string {
    const key = keyOf(config);
    const m = this.kindMap(config.meta.kind);
    if (m.has(key)) throw new AgentError('BAD_INPUT', `${key} already exists`);
    const stored = this.stamp(config);
    m.set(key, stored);
    this.notify(config.meta.kind, undefined, stored, 'add');
    return stored.meta.resourceVersion;
  }

  update(config: Config): string {
    const key = keyOf(config);
    const m = this.kindMap(config.meta.kind);
    const old = m.get(key);
    if (!old) throw new AgentError('BAD_INPUT', `${key} does not exist`);
    if (config.meta.resourceVersion && config.meta.resourceVersion !== old.meta.resourceVersion) {
      throw new AgentError(
        'BAD_INPUT',
        `${key}: resourceVersion ${config.meta.resourceVersion} is stale (current ${old.meta.resourceVersion})`,
      );
    }
    const stored = this.stamp(config);
    m.set(key, stored);
    this.notify(config.meta.kind, old, stored, 'update');
    return stored.meta.resourceVersion;
  }

  delete(kind: Kind, name: string, namespace: string): void {
    const key = configKey(kind, namespace, name);
    const m = this.kindMap(kind);
    const old = m.get(key);
    if (!old) throw new AgentError('BAD_INPUT', `${key} does not exist`);
    m.delete(key);
    this.revision++;
    this.notify(kind, old, undefined, 'delete');
  }

  version(): string {
    return String(this.revision);
  }

  /** Handlers must be registered before the first change they want to see (as with Istio's cache before Run). */
  registerEventHandler(kind: Kind, handler: ConfigHandler): void {
    const list = this.handlers.get(kind) ?? [];
    list.push(handler);
    this.handlers.set(kind, list);
  }

  private kindMap(kind: Kind): Map<string, Config> {
    let m = this.byKind.get(kind);
    if (!m) this.byKind.set(kind, (m = new Map()));
    return m;
  }

  private stamp(config: Config): Config {
    this.revision++;
    return Object.freeze({
      meta: Object.freeze({ ...config.meta, resourceVersion: String(this.revision) }),
      spec: config.spec,
    });
  }

  private notify(kind: Kind, old: Config | undefined, cur: Config | undefined, event: Event): void {
    for (const h of this.handlers.get(kind) ?? []) h(old, cur, event);
  }
}

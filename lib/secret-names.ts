// The SDS resource names this agent serves, and which of them the configuration of this Envoy references.
//
// `default` and `ROOTCA` are the workload's own; `file-cert:<cert>~<key>`, `file-root:<path>` and
// `file-root:system` name files, and a name from an SDS client becomes a file path only if this Envoy's
// configuration names it: the bootstrap the agent wrote, or the listeners and clusters the control plane sent
// through the xDS proxy (whoever can connect to the SDS socket cannot make the agent read a file of its choice).
// SecretReferences holds that set, per source (the bootstrap, one xDS stream's state-of-the-world type, one Delta
// resource), so a source that goes away or changes takes exactly its names with it.

export type SecretName =
  | { kind: 'workload' }
  | { kind: 'root' }
  | { kind: 'file-cert'; cert: string; key: string }
  | { kind: 'file-root'; file: string }
  | { kind: 'system-root' };

export const WORKLOAD_SECRET = 'default';
export const ROOT_SECRET = 'ROOTCA';
const FILE_CERT = 'file-cert:';
const FILE_ROOT = 'file-root:';

/** What a name means; undefined for a name this agent does not serve. */
export function parseSecretName(name: string): SecretName | undefined {
  if (name === WORKLOAD_SECRET) return { kind: 'workload' };
  if (name === ROOT_SECRET) return { kind: 'root' };
  if (name.includes('\0')) return undefined;
  if (name.startsWith(FILE_CERT)) {
    const parts = name.slice(FILE_CERT.length).split('~');
    if (parts.length !== 2 || !parts[0] || !parts[1]) return undefined;
    return { kind: 'file-cert', cert: parts[0], key: parts[1] };
  }
  if (name === `${FILE_ROOT}system`) return { kind: 'system-root' };
  const file = name.startsWith(FILE_ROOT) ? name.slice(FILE_ROOT.length) : '';
  if (file) return { kind: 'file-root', file };
  return undefined;
}

/** Names that read a file, and so are served only when referenced. */
export function namesFile(name: string): boolean {
  return name.startsWith(FILE_CERT) || name.startsWith(FILE_ROOT);
}

/** Whether a buffer may hold a file name at all (a cheap test before a resource is decoded). */
export function mayNameFile(buf: Buffer): boolean {
  return buf.includes(FILE_CERT) || buf.includes(FILE_ROOT);
}

/** Every `name` beside an `sds_config` in a JSON config (the bootstrap): the SdsSecretConfigs it holds. */
export function sdsNamesInJson(value: unknown, out: Set<string> = new Set()): Set<string> {
  if (Array.isArray(value)) for (const v of value) sdsNamesInJson(v, out);
  else if (value && typeof value === 'object') {
    const o = value as Record<string, unknown>;
    if (typeof o.name === 'string' && o.sds_config && typeof o.sds_config === 'object') out.add(o.name);
    for (const v of Object.values(o)) sdsNamesInJson(v, out);
  }
  return out;
}

export interface SecretReferenceSink {
  /** The names `source` references now (replacing what it referenced before; none: forget the source). */
  set(source: string, names: Iterable<string>): void;
}

export class SecretReferences implements SecretReferenceSink {
  private readonly bySource = new Map<string, Set<string>>();
  private readonly counts = new Map<string, number>();
  private readonly listeners: ((added: string[]) => void)[] = [];

  set(source: string, names: Iterable<string>): void {
    const next = new Set([...names].filter(namesFile));
    const prev = this.bySource.get(source);
    if (next.size) this.bySource.set(source, next);
    else this.bySource.delete(source);
    const added: string[] = [];
    for (const n of next) {
      if (prev?.has(n)) continue;
      const c = this.counts.get(n) ?? 0;
      this.counts.set(n, c + 1);
      if (c === 0) added.push(n);
    }
    for (const n of prev ?? []) {
      if (next.has(n)) continue;
      const c = (this.counts.get(n) ?? 1) - 1;
      if (c <= 0) this.counts.delete(n);
      else this.counts.set(n, c);
    }
    if (added.length) for (const fn of this.listeners) fn(added);
  }

  has(name: string): boolean {
    return this.counts.has(name);
  }

  /** Called with the names that became referenced. */
  onAdded(fn: (added: string[]) => void): void {
    this.listeners.push(fn);
  }

  get size(): number {
    return this.counts.size;
  }
}

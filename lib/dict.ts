// User-supplied keys (JSON, YAML, environment, annotations, xDS metadata) never reach a prototype:
// - maps the agent looks keys up in have no prototype (`dict()`), so `constructor` is not found in an empty one;
// - plain objects built for output (node metadata, a merged bootstrap) get user keys as own properties
//   (`setOwn`), so `__proto__` is a key, as it is in Go's maps, never the prototype setter.

export type Dict<T> = Record<string, T>;

export function dict<T>(entries?: Iterable<readonly [string, T]> | Readonly<Record<string, T>>): Dict<T> {
  const out = Object.create(null) as Dict<T>;
  if (!entries) return out;
  const list =
    Symbol.iterator in entries
      ? (entries as Iterable<readonly [string, T]>)
      : Object.entries(entries as Record<string, T>);
  for (const [k, v] of list) out[k] = v;
  return out;
}

/** obj[key] = value, as a data property even for `__proto__`. */
export function setOwn<T>(obj: Record<string, T>, key: string, value: T): void {
  Object.defineProperty(obj, key, { value, writable: true, enumerable: true, configurable: true });
}

/** A plain object with the source's own enumerable keys. */
export function plainCopy<T>(src: Readonly<Record<string, T>>): Record<string, T> {
  const out: Record<string, T> = {};
  for (const [k, v] of Object.entries(src)) setOwn(out, k, v);
  return out;
}

/** The value of an own key, never an inherited one. */
export function own<T>(obj: Readonly<Record<string, T>>, key: string): T | undefined {
  return Object.hasOwn(obj, key) ? obj[key] : undefined;
}

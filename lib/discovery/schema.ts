// Strict readers for untyped YAML values: each read names the field path it looked at, and every problem is
// collected as (path, message) so the caller can point at the exact line. Unknown fields are problems too.

import { MAX_PROTO_DURATION_MS, parseDuration } from '../duration';
import { dict } from '../dict';
import { quote } from '../errors';

export type Path = (string | number)[];

export interface Problem {
  path: Path;
  message: string;
}

/** `spec.http[0].route[1].weight` */
export function formatPath(path: Path): string {
  let out = '';
  for (const p of path) out += typeof p === 'number' ? `[${p}]` : out ? `.${p}` : p;
  return out;
}

export class Reader {
  readonly problems: Problem[] = [];

  fail(path: Path, message: string): undefined {
    this.problems.push({ path, message });
    return undefined;
  }

  /** An object with only the listed keys; `required` keys must be present when the object is. */
  object(
    v: unknown,
    path: Path,
    allowed: readonly string[],
    required: readonly string[] = [],
  ): Record<string, unknown> | undefined {
    // An absent object is the parent's business (its own `required` list); `required` here is for keys inside.
    if (v === undefined || v === null) return undefined;
    if (typeof v !== 'object' || Array.isArray(v)) return this.fail(path, `must be a mapping, not ${describeValue(v)}`);
    const o = v as Record<string, unknown>;
    for (const k of Object.keys(o)) {
      if (!allowed.includes(k))
        this.fail([...path, k], `unknown or unsupported field "${k}" (supported here: ${allowed.join(', ')})`);
    }
    for (const k of required) if (o[k] === undefined || o[k] === null) this.fail([...path, k], 'is required');
    return o;
  }

  /** A mapping with free-form keys (port names, header names). */
  mapping(v: unknown, path: Path): Record<string, unknown> | undefined {
    if (v === undefined || v === null) return undefined;
    if (typeof v !== 'object' || Array.isArray(v)) return this.fail(path, `must be a mapping, not ${describeValue(v)}`);
    return v as Record<string, unknown>;
  }

  array(v: unknown, path: Path, opts: { required?: boolean; nonEmpty?: boolean } = {}): unknown[] {
    if (v === undefined || v === null) {
      if (opts.required) this.fail(path, 'is required');
      return [];
    }
    if (!Array.isArray(v)) {
      this.fail(path, `must be a list, not ${describeValue(v)}`);
      return [];
    }
    if (opts.nonEmpty && v.length === 0) this.fail(path, 'must not be empty');
    return v;
  }

  string(
    v: unknown,
    path: Path,
    opts: { required?: boolean; pattern?: RegExp; patternText?: string } = {},
  ): string | undefined {
    if (v === undefined || v === null) return opts.required ? this.fail(path, 'is required') : undefined;
    if (typeof v !== 'string') return this.fail(path, `must be a string, not ${describeValue(v)}`);
    if (v === '' && opts.required) return this.fail(path, 'must not be empty');
    if (opts.pattern && !opts.pattern.test(v))
      return this.fail(path, `${quote(v)} is not ${opts.patternText ?? `matching ${opts.pattern}`}`);
    return v;
  }

  oneOf<T extends string>(
    v: unknown,
    path: Path,
    values: readonly T[],
    opts: { required?: boolean; unsupported?: readonly string[] } = {},
  ): T | undefined {
    const s = this.string(v, path, { required: opts.required });
    if (s === undefined) return undefined;
    if (opts.unsupported?.includes(s))
      return this.fail(
        path,
        `${quote(s)} is not supported by the standalone discovery server (supported: ${values.join(', ')})`,
      );
    if (!values.includes(s as T)) return this.fail(path, `${quote(s)} is not one of ${values.join(', ')}`);
    return s as T;
  }

  int(v: unknown, path: Path, opts: { required?: boolean; min?: number; max?: number } = {}): number | undefined {
    if (v === undefined || v === null) return opts.required ? this.fail(path, 'is required') : undefined;
    if (typeof v !== 'number' || !Number.isInteger(v))
      return this.fail(path, `must be an integer, not ${describeValue(v)}`);
    if (opts.min !== undefined && v < opts.min) return this.fail(path, `${v} is below the minimum ${opts.min}`);
    if (opts.max !== undefined && v > opts.max) return this.fail(path, `${v} is above the maximum ${opts.max}`);
    return v;
  }

  port(v: unknown, path: Path, required = false): number | undefined {
    return this.int(v, path, { required, min: 1, max: 65535 });
  }

  bool(v: unknown, path: Path): boolean | undefined {
    if (v === undefined || v === null) return undefined;
    if (typeof v !== 'boolean') return this.fail(path, `must be true or false, not ${describeValue(v)}`);
    return v;
  }

  /** A Go/protobuf duration string (`1.5s`, `250ms`); milliseconds. */
  duration(v: unknown, path: Path): number | undefined {
    const s = this.string(v, path);
    if (s === undefined) return undefined;
    try {
      // Envoy, not the agent, acts on these: protobuf's range, as Istio validates them.
      return parseDuration(s, { maxMs: MAX_PROTO_DURATION_MS });
    } catch (e) {
      return this.fail(path, (e as Error).message);
    }
  }

  stringMap(v: unknown, path: Path): Record<string, string> {
    const out = dict<string>();
    if (v === undefined || v === null) return out;
    if (typeof v !== 'object' || Array.isArray(v)) {
      this.fail(path, `must be a mapping of strings, not ${describeValue(v)}`);
      return out;
    }
    for (const [k, val] of Object.entries(v as Record<string, unknown>)) {
      const s = this.string(val, [...path, k]);
      if (s !== undefined) out[k] = s;
    }
    return out;
  }
}

function describeValue(v: unknown): string {
  if (Array.isArray(v)) return 'a list';
  if (v === null) return 'null';
  if (typeof v === 'object') return 'a mapping';
  return `${typeof v} ${quote(v)}`;
}

export const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
export const DNS_NAME = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;
/** A hostname, optionally with a leading `*.` wildcard, or `*`. */
export const HOST = /^(\*|(\*\.)?[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*)$/;

/** A non-empty list of distinct hostnames; `*` only where allowStar. */
export function readHosts(r: Reader, v: unknown, path: Path, allowStar: boolean): string[] {
  const hosts: string[] = [];
  r.array(v, path, { required: true, nonEmpty: true }).forEach((h, i) => {
    const s = r.string(h, [...path, i], { required: true, pattern: HOST, patternText: 'a hostname' });
    if (s === undefined) return;
    if (s === '*' && !allowStar) r.fail([...path, i], '"*" is not allowed here');
    else if (hosts.includes(s)) r.fail([...path, i], `host "${s}" is listed twice`);
    else hosts.push(s);
  });
  return hosts;
}

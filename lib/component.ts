// The one shape every long-lived part of the agent has, and what it may contribute to the status server.
//
// agent.ts starts components in order, races their `closed` promises (the first to end ends the agent) and
// closes them in reverse order. A component that serves something on the status port lists its routes; one
// that gates readiness gives a condition with a reason (the 503 body lists every unmet one); one that measures
// something registers its metrics into the agent's single registry. Nothing else about a component is known
// outside its own file.

import type { Registry } from './prom';
import type * as http from 'node:http';

/** An answer of the status server (lib/status-server.ts) to one request. */
export interface Reply {
  status: number;
  body: string | Buffer;
  contentType?: string;
  headers?: Record<string, string>;
}

export type Handler = (req: http.IncomingMessage) => Promise<Reply> | Reply;

/** One readiness condition: `reason` says what is missing when `ready` is false. */
export interface Condition {
  ready: boolean;
  reason: string;
}

export interface StatusRoute {
  method: 'GET' | 'POST' | 'PUT' | 'DELETE';
  /** Exact path, or a prefix when it ends with `/` (e.g. `/app-health/`). */
  path: string;
  handler: Handler;
  /** Answer only loopback peers (lifecycle and debug endpoints). */
  localOnly?: boolean;
}

/** A JSON reply for a status route (debug endpoints). */
export const json = (value: unknown, status = 200): Reply => ({
  status,
  body: JSON.stringify(value, null, 2) + '\n',
  contentType: 'application/json',
});

export interface Component {
  /** Used in logs, in the 503 body and in "X closed: ..." when it ends the agent. */
  readonly name: string;
  /** Resolves once the component serves (listening, connected, spawned); rejects with an AgentError if it cannot. */
  start(): Promise<void>;
  /** Stops it; safe to call twice and before start(). */
  close(): Promise<void>;
  /** Resolves when the component has ended, with the error that ended it, or undefined after close(). Never rejects. */
  readonly closed: Promise<Error | undefined>;
  /** Routes this component serves on the status port. */
  routes?(): StatusRoute[];
  /** Readiness: the agent is ready only when every component that has a condition meets it. */
  readiness?(): Condition | Promise<Condition>;
  /** Registers this component's metrics (collect callbacks read its counters at scrape time). */
  registerMetrics?(registry: Registry): void;
}

/** A `closed` promise and its resolver, resolved at most once. */
export function closedSignal(): { closed: Promise<Error | undefined>; resolve: (err?: Error) => void } {
  let done = false;
  let res!: (e: Error | undefined) => void;
  const closed = new Promise<Error | undefined>((r) => (res = r));
  return {
    closed,
    resolve: (err) => {
      if (done) return;
      done = true;
      res(err);
    },
  };
}

/** Evaluates every condition; a condition that throws is unmet with the error as its reason. */
export async function composeReadiness(components: readonly Component[]): Promise<Condition> {
  const reasons: string[] = [];
  for (const c of components) {
    if (!c.readiness) continue;
    let r: Condition;
    try {
      r = await c.readiness();
    } catch (err) {
      r = { ready: false, reason: `${c.name}: ${(err as Error).message}` };
    }
    if (!r.ready) reasons.push(r.reason);
  }
  return reasons.length ? { ready: false, reason: reasons.join('\n') } : { ready: true, reason: '' };
}

/**
 * Starts components in order; if one fails, closes those already started (in reverse) and rethrows. Components in
 * `alreadyStarted` (started earlier, e.g. Envoy before the rest of the agent loads) are skipped but rolled back too.
 */
export async function startAll(
  components: readonly Component[],
  alreadyStarted: readonly Component[] = [],
): Promise<void> {
  const started: Component[] = [...alreadyStarted];
  for (const c of components) {
    if (alreadyStarted.includes(c)) continue;
    try {
      await c.start();
    } catch (err) {
      await closeAll(started);
      throw err;
    }
    started.push(c);
  }
}

/** Closes components in reverse order; a close that throws does not stop the others. */
export async function closeAll(components: readonly Component[]): Promise<void> {
  for (const c of [...components].reverse()) await c.close().catch(() => undefined);
}

/** Resolves with the first component to end and the error it ended with (undefined: it ended cleanly). */
export function firstToEnd(
  components: readonly Component[],
): Promise<{ component: Component; err: Error | undefined }> {
  return Promise.race(components.map((c) => c.closed.then((err) => ({ component: c, err }))));
}

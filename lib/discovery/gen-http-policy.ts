// Per-route HTTP policy, mapped to the Envoy fields istiod generates (istio/istio 86c9f01f,
// pilot/pkg/networking/core/route/route.go and route/retry/retry.go): retries, fault injection and CORS as
// per-filter config, mirroring, header manipulation. Pure: values in, Envoy route fields out.

import { packAny } from '../envoy-protos';
import type { CorsPolicy, HeaderOperations, HttpFault, HttpRoute, Percent, StringMatch } from './model';
import { dur } from './resources';

const PREVIOUS_HOSTS = 'envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate';
const PREVIOUS_PRIORITIES = 'envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig';
const FAULT = 'envoy.extensions.filters.http.fault.v3.HTTPFault';
const CORS_POLICY = 'envoy.extensions.filters.http.cors.v3.CorsPolicy';

export const FAULT_FILTER = 'envoy.filters.http.fault';
export const CORS_FILTER = 'envoy.filters.http.cors';

// istiod's default: connection-level failures only. `retriable-status-codes` is listed but no code is, so a 503
// from the backend is returned, not retried.
const DEFAULT_RETRY_ON = 'connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes';

/** The route's retry_policy, or undefined when `attempts: 0` turns retries off. `hashPolicy`: consistent hashing
 * is on for the destination, so retries stay on the same host (no previous_hosts predicate), as istiod does. */
export function retryPolicy(r: HttpRoute['retries'], hashPolicy = false): Record<string, unknown> | undefined {
  if (r && r.attempts <= 0) return undefined;
  const p: Record<string, unknown> = {
    retry_on: DEFAULT_RETRY_ON,
    num_retries: { value: r?.attempts ?? 2 },
    host_selection_retry_max_attempts: 5,
  };
  if (!hashPolicy)
    p.retry_host_predicate = [
      { name: 'envoy.retry_host_predicates.previous_hosts', typed_config: packAny(PREVIOUS_HOSTS, {}) },
    ];
  if (r?.retryOn) {
    // Integers in retryOn are status codes; `retriable-status-codes` is added when codes are given without it.
    const conditions: string[] = [];
    const codes: number[] = [];
    for (const part of r.retryOn
      .split(',')
      .map((x) => x.trim())
      .filter(Boolean)) {
      if (/^\d+$/.test(part) && Number(part) >= 100 && Number(part) <= 599) codes.push(Number(part));
      else conditions.push(part);
    }
    if (codes.length && !conditions.includes('retriable-status-codes')) conditions.push('retriable-status-codes');
    p.retry_on = conditions.join(',');
    if (codes.length) p.retriable_status_codes = codes;
  }
  if (r?.perTryTimeoutMs !== undefined) p.per_try_timeout = dur(r.perTryTimeoutMs);
  // An explicit retryIgnorePreviousHosts decides the previous_hosts predicate, whatever the hashing.
  if (r?.ignorePreviousHosts === false) delete p.retry_host_predicate;
  if (r?.ignorePreviousHosts === true)
    p.retry_host_predicate = [
      { name: 'envoy.retry_host_predicates.previous_hosts', typed_config: packAny(PREVIOUS_HOSTS, {}) },
    ];
  if (r?.backoffMs !== undefined) p.retry_back_off = { base_interval: dur(r.backoffMs) };
  // A retry prefers another priority (locality) than the one that failed.
  if (r?.retryRemoteLocalities)
    p.retry_priority = {
      name: 'envoy.retry_priorities.previous_priorities',
      typed_config: packAny(PREVIOUS_PRIORITIES, { update_frequency: 2 }),
    };
  return p;
}

/** Istio's Percent (0-100, fractions allowed) as an Envoy FractionalPercent per million. */
export function fractionalPercent(p: Percent | undefined): Record<string, unknown> {
  return { numerator: Math.round((p ?? 100) * 10_000), denominator: 'MILLION' };
}

function faultConfig(f: HttpFault): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  if (f.delay)
    out.delay = { fixed_delay: dur(f.delay.fixedDelayMs), percentage: fractionalPercent(f.delay.percentage) };
  if (f.abort) {
    out.abort =
      f.abort.grpcStatus !== undefined
        ? { grpc_status: f.abort.grpcStatus, percentage: fractionalPercent(f.abort.percentage) }
        : { http_status: f.abort.httpStatus, percentage: fractionalPercent(f.abort.percentage) };
  }
  return out;
}

function stringMatcher(sm: StringMatch): Record<string, unknown> {
  if ('exact' in sm) return { exact: sm.exact };
  if ('prefix' in sm) return { prefix: sm.prefix };
  return { safe_regex: { regex: sm.regex } };
}

function corsConfig(c: CorsPolicy): Record<string, unknown> {
  const out: Record<string, unknown> = {
    allow_origin_string_match: c.allowOrigins.map(stringMatcher),
    filter_enabled: { default_value: { numerator: 100, denominator: 'HUNDRED' } },
  };
  if (c.allowMethods.length) out.allow_methods = c.allowMethods.join(',');
  if (c.allowHeaders.length) out.allow_headers = c.allowHeaders.join(',');
  if (c.exposeHeaders.length) out.expose_headers = c.exposeHeaders.join(',');
  if (c.maxAgeMs !== undefined) out.max_age = String(Math.floor(c.maxAgeMs / 1000));
  if (c.allowCredentials !== undefined) out.allow_credentials = { value: c.allowCredentials };
  return out;
}

/** typed_per_filter_config of a route: fault and CORS, which the HCM's fault and cors filters read. */
export function perFilterConfig(r: HttpRoute): Record<string, unknown> | undefined {
  const out: Record<string, unknown> = {};
  if (r.fault) out[FAULT_FILTER] = packAny(FAULT, faultConfig(r.fault));
  if (r.corsPolicy) out[CORS_FILTER] = packAny(CORS_POLICY, corsConfig(r.corsPolicy));
  return Object.keys(out).length ? out : undefined;
}

/** request_mirror_policies for a mirror cluster. */
export function mirrorPolicies(cluster: string, percentage: Percent | undefined): Record<string, unknown>[] {
  return [
    { cluster, runtime_fraction: { default_value: fractionalPercent(percentage) }, trace_sampled: { value: false } },
  ];
}

function headersToAdd(ops: HeaderOperations): Record<string, unknown>[] {
  // `set` replaces any value the request already has; `add` appends another one.
  return [
    ...Object.entries(ops.set).map(([key, value]) => ({
      header: { key, value },
      append_action: 'OVERWRITE_IF_EXISTS_OR_ADD',
    })),
    ...Object.entries(ops.add).map(([key, value]) => ({
      header: { key, value },
      append_action: 'APPEND_IF_EXISTS_OR_ADD',
    })),
  ];
}

/** Route-level header manipulation fields (request_headers_to_add, ..._to_remove, and the response ones). */
export function headerFields(h: HttpRoute['headers']): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  if (h?.request) {
    const add = headersToAdd(h.request);
    if (add.length) out.request_headers_to_add = add;
    if (h.request.remove.length) out.request_headers_to_remove = [...h.request.remove];
  }
  if (h?.response) {
    const add = headersToAdd(h.response);
    if (add.length) out.response_headers_to_add = add;
    if (h.response.remove.length) out.response_headers_to_remove = [...h.response.remove];
  }
  return out;
}

// The HTTP connection manager's `tracing` block, as istiod builds it (istio/istio 86c9f01f,
// pilot/pkg/networking/core/tracing.go configureTracingFromTelemetry; pilot/pkg/model/telemetry.go Tracing).
//
// Two ways in, as in istiod without Telemetry resources:
// - meshConfig `defaultProviders.tracing` names a zipkin `extensionProviders` entry: the block carries the provider
//   (`envoy.tracers.zipkin`, collector cluster `outbound|<port>||<host>` of the service it names), routers spawn an
//   upstream span, and Istio's tags are always on.
// - otherwise `enableTracing: true`: the block has no provider, and Envoy reports to the bootstrap's tracer (the
//   `zipkin` cluster the agent builds from ProxyConfig `tracing.zipkin.address`).
// Sampling, custom tags and the path tag length come from the proxy's ProxyConfig (its PROXY_CONFIG metadata,
// else meshConfig defaultConfig). `sampling: 0` means unset there, so it is istiod's default 1%.

import { packAny } from '../envoy-protos';
import { scope } from '../log';
import type { CustomTag, ZipkinProvider } from './mesh-tracing';
import type { Proxy } from './proxy';
import type { PushContext } from './push-context';
import { clusterName } from './resources';

const log = scope('tracing');

const ZIPKIN_CONFIG = 'envoy.config.trace.v3.ZipkinConfig';
/** PILOT_TRACE_SAMPLING's default in istiod. */
const DEFAULT_SAMPLING = 1;

/** Which HTTP connection manager: a sidecar's outbound or inbound one, or a gateway's. */
export type ListenerClass = 'outbound' | 'inbound' | 'gateway';

/**
 * The HCM `tracing` field for this proxy, or undefined when tracing is off (or its provider is not found).
 * `cls`: istiod picks the client spec (outbound, gateway) or the server spec (inbound); without Telemetry
 * resources both are the same, so the class does not change the block here.
 */
export function hcmTracing(push: PushContext, proxy: Proxy, _cls: ListenerClass): Record<string, unknown> | undefined {
  const mesh = push.mesh.tracing;
  if (!mesh) return undefined;
  const cfg = proxy.proxyConfig ? proxy.proxyConfig.tracing : mesh.defaultConfig;
  const sampling = cfg?.sampling ? (cfg.sampling > 100 ? 1 : cfg.sampling) : DEFAULT_SAMPLING;
  let out: Record<string, unknown>;
  let istioTags: boolean;
  if (mesh.provider) {
    const provider = zipkinProvider(push, proxy, mesh.provider);
    if (!provider) return undefined;
    out = provider;
    istioTags = true;
  } else if (mesh.enableTracing) {
    out = {};
    istioTags = cfg?.enableIstioTags ?? true;
  } else return undefined;
  out.client_sampling = { value: 100 };
  out.overall_sampling = { value: 100 };
  out.random_sampling = { value: sampling };
  const tags = [...(istioTags ? [...serviceTags(proxy), ...POLICY_TAGS] : []), ...customTags(cfg?.customTags ?? {})];
  out.custom_tags = tags.sort((a, b) => (a.tag < b.tag ? -1 : a.tag > b.tag ? 1 : 0));
  if (out.max_path_tag_length === undefined && cfg?.maxPathTagLength)
    out.max_path_tag_length = { value: cfg.maxPathTagLength };
  return out;
}

/** A key that tells apart proxies whose tracing blocks differ, for the listeners' memo keys. */
export function tracingKey(push: PushContext, proxy: Proxy): string {
  if (!push.mesh.tracing) return '';
  return JSON.stringify([
    proxy.type,
    proxy.namespace,
    proxy.labels['service.istio.io/canonical-name'],
    proxy.labels['service.istio.io/canonical-revision'],
    proxy.meshId,
    proxy.clusterId,
    proxy.proxyConfig ?? null,
  ]);
}

function zipkinProvider(push: PushContext, proxy: Proxy, p: ZipkinProvider): Record<string, unknown> | undefined {
  // istiod's LookupCluster: `namespace/host`, or a host that only one namespace defines; the port is not checked.
  const slash = p.service.indexOf('/');
  const host = slash < 0 ? p.service : p.service.slice(slash + 1);
  const svc = push.services.find(
    (s) => s.hostname === host && (slash < 0 || s.namespace === p.service.slice(0, slash)),
  );
  if (!svc || (slash < 0 && push.services.filter((s) => s.hostname === host).length > 1)) {
    log.warn(`tracing provider "${p.name}": no single service ${p.service} in the registry; no tracing configured`);
    return undefined;
  }
  // istiod gives proxies before 1.29 this form (collector_cluster/endpoint/hostname); the later collector_service
  // form is not in this build's Envoy descriptor. Both send the same spans.
  const zipkin = {
    collector_cluster: clusterName(p.port, '', svc.hostname),
    collector_endpoint: p.path ?? '/api/v2/spans',
    collector_endpoint_version: 'HTTP_JSON',
    trace_id_128bit: !p.enable64bitTraceId,
    shared_span_context: { value: false },
    collector_hostname: svc.hostname,
  };
  const out: Record<string, unknown> = {
    provider: { name: 'envoy.tracers.zipkin', typed_config: packAny(ZIPKIN_CONFIG, zipkin) },
  };
  if (proxy.type === 'router') out.spawn_upstream_span = { value: true };
  if (p.maxTagLength) out.max_path_tag_length = { value: p.maxTagLength };
  return out;
}

function literal(tag: string, value: string): { tag: string } & Record<string, unknown> {
  return { tag, literal: { value } };
}

function serviceTags(proxy: Proxy): ({ tag: string } & Record<string, unknown>)[] {
  return [
    literal('istio.canonical_revision', proxy.labels['service.istio.io/canonical-revision'] || 'latest'),
    literal('istio.canonical_service', proxy.labels['service.istio.io/canonical-name'] || 'unknown'),
    literal('istio.mesh_id', proxy.meshId || 'unknown'),
    literal('istio.namespace', proxy.namespace || 'default'),
    literal('istio.cluster_id', proxy.clusterId || 'unknown'),
  ];
}

// The RBAC dry-run results istiod tags every span with (request metadata of envoy.filters.http.rbac).
const POLICY_TAGS = (
  [
    ['istio.authorization.dry_run.allow_policy.name', 'istio_dry_run_allow_shadow_effective_policy_id'],
    ['istio.authorization.dry_run.allow_policy.result', 'istio_dry_run_allow_shadow_engine_result'],
    ['istio.authorization.dry_run.deny_policy.name', 'istio_dry_run_deny_shadow_effective_policy_id'],
    ['istio.authorization.dry_run.deny_policy.result', 'istio_dry_run_deny_shadow_engine_result'],
  ] as const
).map(([tag, key]) => ({
  tag,
  metadata: { kind: { request: {} }, metadata_key: { key: 'envoy.filters.http.rbac', path: [{ key }] } },
}));

function customTags(tags: Readonly<Record<string, CustomTag>>): ({ tag: string } & Record<string, unknown>)[] {
  return Object.entries(tags).map(([tag, t]) => {
    if ('literal' in t) return literal(tag, t.literal.value);
    if ('environment' in t)
      return { tag, environment: { name: t.environment.name, default_value: t.environment.defaultValue ?? '' } };
    return { tag, request_header: { name: t.header.name, default_value: t.header.defaultValue ?? '' } };
  });
}

// WasmPlugins as istiod serves them (pilot/pkg/model/extensions.go, push_context.go TrafficExtensionsByListenerInfo,
// networking/core/extension/extensionfilter.go, xds/ecds.go): a proxy gets the plugins of its namespace and of the
// root namespace whose selector (or Gateway API targetRefs) picks it; each HTTP connection manager whose listener
// the plugin's `match` admits (mode: CLIENT for outbound and gateway listeners, SERVER for inbound; ports) carries
// an `extension_config_discovery` filter per plugin, in phase order (AUTHN, AUTHZ, STATS, then the rest; higher
// priority first), named by the plugin's ECDS resource. That resource, a TypedExtensionConfig, holds the Wasm
// filter with the module as a remote data source (`http_uri` = the url, `oci://` when it has no scheme, cluster
// `_`; `sha256`), and the settings meant for the agent in the VM's environment: ISTIO_META_WASM_IMAGE_PULL_SECRET
// (the pull secret's docker config itself, or "" when it is missing or may not be sent), _IMAGE_PULL_POLICY,
// _PLUGIN_RESOURCE_VERSION. The agent fetches the module, strips those and hands Envoy a local file.

import { packAny, typeUrl } from '../envoy-protos';
import { type Config, labelsMatch, type WasmPhase, type WasmPluginSpec } from './model';
import type { Proxy } from './proxy';
import { ROOT_NAMESPACE, type PushContext } from './push-context';
import { ADS_SOURCE, dur, encodeResource, EXTENSION_CONFIG, type Resource } from './resources';

const WASM_HTTP = 'envoy.extensions.filters.http.wasm.v3.Wasm';
const WASM_NETWORK = 'envoy.extensions.filters.network.wasm.v3.Wasm';
// The agent's stand-in when a module cannot be had (allow-all or deny-all RBAC), so Envoy must accept it too.
const RBAC_HTTP = 'envoy.extensions.filters.http.rbac.v3.RBAC';
const RBAC_NETWORK = 'envoy.extensions.filters.network.rbac.v3.RBAC';
const STRING_VALUE = 'google.protobuf.StringValue';

export const WASM_SECRET_ENV = 'ISTIO_META_WASM_IMAGE_PULL_SECRET';
export const WASM_POLICY_ENV = 'ISTIO_META_WASM_IMAGE_PULL_POLICY';
export const WASM_RESOURCE_VERSION_ENV = 'ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION';

/** The ECDS resource (and filter) name of a WasmPlugin, as istiod names it. */
export const wasmResourceName = (namespace: string, name: string) =>
  `extensions.istio.io/wasmplugin/${namespace}.${name}`;

const PHASES: readonly WasmPhase[] = ['AUTHN', 'AUTHZ', 'STATS', 'UNSPECIFIED_PHASE'];
const FAILURE_POLICY = { FAIL_CLOSE: 'FAIL_CLOSED', FAIL_OPEN: 'FAIL_OPEN', FAIL_RELOAD: 'FAIL_RELOAD' } as const;

/** Which listener a filter chain belongs to: decides the workload mode a plugin's `match` is compared with. */
export type ListenerClass = 'outbound' | 'inbound' | 'gateway';

/** The plugins of one proxy, and the filters they put on each of its listeners. */
export interface ProxyWasm {
  /** Changes when the selected plugins change: part of every memo key of resources that carry their filters. */
  readonly key: string;
  readonly plugins: readonly Config<WasmPluginSpec>[];
  /** HTTP filters to put before the connection manager's own (istiod: after authn/authz, before grpc_stats). */
  http(cls: ListenerClass, port: number): Record<string, unknown>[];
  /** Network filters to put before a TCP chain's tcp_proxy. */
  network(cls: ListenerClass, port: number): Record<string, unknown>[];
}

const NONE: ProxyWasm = Object.freeze({ key: '-', plugins: [], http: () => [], network: () => [] });

export function proxyWasm(push: PushContext, proxy: Proxy): ProxyWasm {
  if (!push.wasmPlugins.length) return NONE;
  const plugins = selectedPlugins(push, proxy);
  if (!plugins.length) return NONE;
  const key = plugins.map((p) => `${p.meta.namespace}/${p.meta.name}@${p.meta.resourceVersion}`).join(',');
  const filters = (type: WasmPluginSpec['type'], cls: ListenerClass, port: number) =>
    plugins.filter((p) => p.spec.type === type && matches(p.spec, cls, port)).map((p) => ecdsFilter(p, type));
  return Object.freeze({
    key,
    plugins,
    http: (cls: ListenerClass, port: number) => filters('HTTP', cls, port),
    network: (cls: ListenerClass, port: number) => filters('NETWORK', cls, port),
  });
}

/** The proxy's namespace's plugins, then the root namespace's; each selects by labels or Gateway API name. */
function selectedPlugins(push: PushContext, proxy: Proxy): Config<WasmPluginSpec>[] {
  const gatewayName = proxy.labels['gateway.networking.k8s.io/gateway-name'];
  const namespaces = [...new Set([proxy.namespace, ROOT_NAMESPACE])];
  const picked = namespaces.flatMap((ns) =>
    push.wasmPlugins.filter((p) => {
      if (p.meta.namespace !== ns) return false;
      const { targetGateways, selector } = p.spec;
      // As istiod's policy matcher: targetRefs apply only to Gateway API gateways of the plugin's namespace; a
      // plugin without them selects by labels (Gateway API gateways too: ENABLE_SELECTOR_BASED_K8S_GATEWAY_POLICY).
      if (targetGateways) {
        return gatewayName !== undefined && ns === proxy.namespace && targetGateways.includes(gatewayName);
      }
      return !selector || labelsMatch(selector, proxy.labels);
    }),
  );
  const prio = (p: Config<WasmPluginSpec>) => p.spec.priority ?? -(2 ** 31);
  // Stable sorts: phase, then priority (higher first); equal ones keep namespace-then-name order.
  return PHASES.flatMap((phase) => picked.filter((p) => p.spec.phase === phase).sort((a, b) => prio(b) - prio(a)));
}

function matches(spec: WasmPluginSpec, cls: ListenerClass, port: number): boolean {
  if (!spec.match.length) return true;
  const mode = cls === 'inbound' ? 'SERVER' : 'CLIENT';
  return spec.match.some(
    (m) =>
      (m.mode === 'UNDEFINED' || m.mode === 'CLIENT_AND_SERVER' || m.mode === mode) &&
      (!m.ports.length || m.ports.includes(port)),
  );
}

function ecdsFilter(p: Config<WasmPluginSpec>, type: WasmPluginSpec['type']): Record<string, unknown> {
  return {
    name: wasmResourceName(p.meta.namespace, p.meta.name),
    config_discovery: {
      // Envoy waits for the filter however long it takes: it may be what authenticates or authorises requests.
      config_source: { ...ADS_SOURCE, initial_fetch_timeout: dur(0) },
      type_urls: (type === 'HTTP' ? [WASM_HTTP, RBAC_HTTP] : [WASM_NETWORK, RBAC_NETWORK]).map(typeUrl),
    },
  };
}

/** ECDS: the TypedExtensionConfig of each plugin the proxy gets. */
export function buildExtensionConfigs(push: PushContext, proxy: Proxy): ReadonlyMap<string, Resource> {
  const { plugins, key } = proxyWasm(push, proxy);
  if (!plugins.length) return new Map();
  // Pull secrets are credentials: as istiod, only to a proxy that proved who it is, and only over a stream that
  // does not leave the host in plaintext (the rule this server applies to private keys, ./gen-secrets.ts).
  const secrets = push.servePrivateKeys && proxy.identity !== undefined;
  return push.memoize(
    `ecds|${key}|${secrets}`,
    () =>
      new Map(
        plugins.map((p) => {
          const name = wasmResourceName(p.meta.namespace, p.meta.name);
          const pluginConfig = wasmPluginConfig(p, secrets ? pullSecret(push, p) : '');
          const wasm = packAny(p.spec.type === 'HTTP' ? WASM_HTTP : WASM_NETWORK, { config: pluginConfig });
          return [name, encodeResource(EXTENSION_CONFIG, name, { name, typed_config: wasm })] as const;
        }),
      ),
  );
}

function pullSecret(push: PushContext, p: Config<WasmPluginSpec>): string {
  const name = p.spec.imagePullSecret;
  if (!name) return '';
  const s = push.secrets.find((x) => x.meta.namespace === p.meta.namespace && x.meta.name === name);
  return s?.spec.dockerConfigJson ?? '';
}

/** envoy.extensions.wasm.v3.PluginConfig, as istiod's buildWasmConfig. */
export function wasmPluginConfig(p: Config<WasmPluginSpec>, secret: string): Record<string, unknown> {
  const spec = p.spec;
  const keyValues: Record<string, string> = {};
  if (spec.imagePullSecret) keyValues[WASM_SECRET_ENV] = secret;
  if (spec.imagePullPolicy !== 'UNSPECIFIED_POLICY') keyValues[WASM_POLICY_ENV] = spec.imagePullPolicy;
  keyValues[WASM_RESOURCE_VERSION_ENV] = p.meta.resourceVersion;
  for (const e of spec.env) if (e.valueFrom === 'INLINE') keyValues[e.name] = e.value;
  const hostEnvKeys = spec.env.filter((e) => e.valueFrom === 'HOST').map((e) => e.name);
  const config: Record<string, unknown> = {
    name: `${p.meta.namespace}.${p.meta.name}`,
    root_id: spec.pluginName ?? '',
    configuration: spec.pluginConfigJson !== undefined ? packAny(STRING_VALUE, { value: spec.pluginConfigJson }) : {},
    vm_config: {
      runtime: 'envoy.wasm.runtime.v8',
      code: codeSource(spec),
      environment_variables: { key_values: keyValues, ...(hostEnvKeys.length && { host_env_keys: hostEnvKeys }) },
    },
    failure_policy: FAILURE_POLICY[spec.failStrategy],
  };
  return config;
}

function codeSource(spec: WasmPluginSpec): Record<string, unknown> {
  if (spec.url.startsWith('file://')) return { local: { filename: spec.url.slice('file://'.length) } };
  const uri = /^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(spec.url) ? spec.url : `oci://${spec.url}`;
  // The agent fetches the module; the cluster is never used (istiod's "_").
  return { remote: { http_uri: { uri, timeout: dur(30_000), cluster: '_' }, sha256: spec.sha256 ?? '' } };
}

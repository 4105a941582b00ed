// Reading and rewriting one ECDS resource (envoy.config.core.v3.TypedExtensionConfig) that holds a Wasm filter,
// on the wire: the fields the agent acts on are read and replaced, every other byte is kept as it came, so a field
// newer than this agent (Envoy's API grows) reaches Envoy unchanged. Pure: bytes in, bytes out.
//
// The facts are Istio's (pkg/wasm/convert.go, pilot/pkg/model/extensions.go): istiod sends a Wasm filter (HTTP or
// network) whose vm_config.code is `remote.http_uri` (the module's URL, `http(s)://` or `oci://`; cluster "_") with
// `remote.sha256`, and three settings for the agent in vm_config.environment_variables.key_values:
// ISTIO_META_WASM_IMAGE_PULL_SECRET, ISTIO_META_WASM_IMAGE_PULL_POLICY, ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION.
// The agent fetches the module and sends Envoy the same filter with `code.local.filename`, every ISTIO_META_* key
// removed (they are the agent's, the pull secret among them). When the module cannot be had, the filter becomes
// an RBAC filter that allows all (fail open) or denies all (fail closed), under the same name, which Envoy accepts
// because istiod lists the RBAC type among the filter's ECDS type URLs.

import { AgentError } from './errors';
import { forEachField, TYPE_PREFIX } from './xds-codec';

export const EXTENSION_CONFIG_TYPE = `${TYPE_PREFIX}envoy.config.core.v3.TypedExtensionConfig`;
export const WASM_HTTP_TYPE = `${TYPE_PREFIX}envoy.extensions.filters.http.wasm.v3.Wasm`;
export const WASM_NETWORK_TYPE = `${TYPE_PREFIX}envoy.extensions.filters.network.wasm.v3.Wasm`;
export const RBAC_HTTP_TYPE = `${TYPE_PREFIX}envoy.extensions.filters.http.rbac.v3.RBAC`;
export const RBAC_NETWORK_TYPE = `${TYPE_PREFIX}envoy.extensions.filters.network.rbac.v3.RBAC`;
const TYPED_STRUCT_TYPE = `${TYPE_PREFIX}udpa.type.v1.TypedStruct`;

export const WASM_SECRET_ENV = 'ISTIO_META_WASM_IMAGE_PULL_SECRET';
export const WASM_POLICY_ENV = 'ISTIO_META_WASM_IMAGE_PULL_POLICY';
export const WASM_RESOURCE_VERSION_ENV = 'ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION';
const AGENT_ENV_PREFIX = 'ISTIO_META_';

/** Stat prefixes of the stand-in RBAC filters (Go's DefaultAllowStatPrefix / DefaultDenyStatPrefix). */
export const ALLOW_STAT_PREFIX = 'wasm-default-allow';
export const DENY_STAT_PREFIX = 'wasm-default-deny';

export type PullPolicy = 'Unspecified' | 'IfNotPresent' | 'Always';
const PULL_POLICIES: Record<string, PullPolicy> = {
  UNSPECIFIED_POLICY: 'Unspecified',
  IfNotPresent: 'IfNotPresent',
  Always: 'Always',
};

// Field numbers (envoy/config/core/v3, envoy/extensions/wasm/v3, google/protobuf).
const ANY_TYPE = 1,
  ANY_VALUE = 2;
const TEC_NAME = 1,
  TEC_TYPED_CONFIG = 2;
const WASM_CONFIG = 1; // http and network Wasm: PluginConfig config = 1
const PC_NAME = 1,
  PC_VM_CONFIG = 3,
  PC_FAIL_OPEN = 5,
  PC_FAILURE_POLICY = 7;
const VM_CODE = 3,
  VM_ENV = 7;
const ENV_KEY_VALUES = 2;
const ADS_LOCAL = 1,
  ADS_REMOTE = 2;
const DS_FILENAME = 1;
const RDS_HTTP_URI = 1,
  RDS_SHA256 = 2;
const URI_URI = 1,
  URI_TIMEOUT = 3;
const FAILURE_POLICY_FAIL_OPEN = 3;
const WT_VARINT = 0,
  WT_LEN = 2;

interface Field {
  field: number;
  wt: number;
  /** The whole field, tag included. */
  raw: Buffer;
  /** Length-delimited: the value's bytes; varint: empty. */
  value: Buffer;
  varint: number;
}

function fieldsOf(buf: Buffer, what: string): Field[] {
  const out: Field[] = [];
  let from = 0;
  forEachField(
    buf,
    (field, wt, b, s, e, varint) => {
      out.push({
        field,
        wt,
        raw: b.subarray(from, e),
        value: wt === WT_LEN ? b.subarray(s, e) : b.subarray(e, e),
        varint,
      });
      from = e;
    },
    what,
  );
  return out;
}

/** The last occurrence of a length-delimited field (proto3: the last one wins for scalars). */
function lenValue(fields: Field[], n: number): Buffer | undefined {
  let v: Buffer | undefined;
  for (const f of fields) if (f.field === n && f.wt === WT_LEN) v = f.value;
  return v;
}

function varintValue(fields: Field[], n: number): number {
  let v = 0;
  for (const f of fields) if (f.field === n && f.wt === WT_VARINT) v = f.varint;
  return v;
}

function varintBytes(n: number): number[] {
  const out: number[] = [];
  while (n >= 0x80) {
    out.push((n % 128) | 0x80);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return out;
}

export function lenField(field: number, value: Buffer | string): Buffer {
  const v = typeof value === 'string' ? Buffer.from(value, 'utf8') : value;
  return Buffer.concat([Buffer.from([...varintBytes(field * 8 + WT_LEN), ...varintBytes(v.length)]), v]);
}

/** The message with every occurrence of `field` replaced by one `replacement` (where the first was), or dropped. */
function replaced(fields: Field[], field: number, replacement: Buffer | undefined): Buffer {
  const parts: Buffer[] = [];
  let done = false;
  for (const f of fields) {
    if (f.field !== field) parts.push(f.raw);
    else if (!done) {
      done = true;
      if (replacement) parts.push(lenField(field, replacement));
    }
  }
  if (!done && replacement) parts.push(lenField(field, replacement));
  return Buffer.concat(parts);
}

function bad(why: string): AgentError {
  return new AgentError('BAD_INPUT', why);
}

/** What the agent needs to fetch the module of a Wasm filter with remote code. */
export interface RemoteWasm {
  /** TypedExtensionConfig.name: the ECDS resource name (istiod: `<namespace>.<name>`). */
  resourceName: string;
  /** PluginConfig.name, for messages. */
  configName: string;
  network: boolean;
  /** http_uri.uri; undefined when the remote code has no http_uri (Go: miss_remote_fetch_hint). */
  url: string | undefined;
  /** remote.sha256, '' when not given (istiod's "nil" placeholder counts as not given). */
  sha256: string;
  /** http_uri.timeout (istiod sets 30 s); undefined when absent. */
  timeoutMs: number | undefined;
  /** ISTIO_META_WASM_IMAGE_PULL_SECRET: a Docker config JSON. '' when the key is present but empty (an error). */
  pullSecret: string | undefined;
  pullPolicy: PullPolicy;
  resourceVersion: string;
  failOpen: boolean;
}

export type ExtensionConfig =
  /** Not a Wasm filter with remote code: forwarded as `any` (its ISTIO_META_* environment removed if it had any). */
  | { kind: 'passthrough'; name: string; any: Buffer; why: 'not_wasm' | 'typed_struct' | 'local' }
  | { kind: 'remote'; name: string; wasm: RemoteWasm; withLocalFile(filename: string): Buffer; standIn(): Buffer };

/**
 * Reads one ECDS resource (the google.protobuf.Any of a TypedExtensionConfig). Throws BAD_INPUT, naming what is
 * wrong, where Go's agent would NACK: not a TypedExtensionConfig, no typed_config, a Wasm filter without code.
 */
export function readExtensionConfig(any: Buffer): ExtensionConfig {
  const outer = fieldsOf(any, 'google.protobuf.Any');
  const outerType = lenValue(outer, ANY_TYPE)?.toString('utf8') ?? '';
  if (outerType !== EXTENSION_CONFIG_TYPE)
    throw bad(`ECDS resource has type ${JSON.stringify(outerType)}, want ${EXTENSION_CONFIG_TYPE}`);
  const tecBytes = lenValue(outer, ANY_VALUE) ?? Buffer.alloc(0);
  const tec = fieldsOf(tecBytes, 'TypedExtensionConfig');
  const name = lenValue(tec, TEC_NAME)?.toString('utf8') ?? '';
  const tcBytes = lenValue(tec, TEC_TYPED_CONFIG);
  if (!tcBytes) throw bad(`extension config ${JSON.stringify(name)} has no typed_config`);
  const tc = fieldsOf(tcBytes, `typed_config of ${name}`);
  const tcType = lenValue(tc, ANY_TYPE)?.toString('utf8') ?? '';
  if (tcType !== WASM_HTTP_TYPE && tcType !== WASM_NETWORK_TYPE) {
    // A TypedStruct (Go converts a Wasm filter in one through JSON; istiod does not send them) is passed on as it is.
    return { kind: 'passthrough', name, any, why: tcType === TYPED_STRUCT_TYPE ? 'typed_struct' : 'not_wasm' };
  }
  const network = tcType === WASM_NETWORK_TYPE;
  const what = `Wasm ${network ? 'network' : 'HTTP'} filter ${JSON.stringify(name)}`;
  const wasm = fieldsOf(lenValue(tc, ANY_VALUE) ?? Buffer.alloc(0), what);
  const pc = fieldsOf(lenValue(wasm, WASM_CONFIG) ?? Buffer.alloc(0), `${what} config`);
  const configName = lenValue(pc, PC_NAME)?.toString('utf8') ?? '';
  const vm = fieldsOf(lenValue(pc, PC_VM_CONFIG) ?? Buffer.alloc(0), `${what} vm_config`);
  const code = fieldsOf(lenValue(vm, VM_CODE) ?? Buffer.alloc(0), `${what} vm_config.code`);
  const remoteBytes = lenValue(code, ADS_REMOTE);
  const hasLocal = lenValue(code, ADS_LOCAL) !== undefined;
  if (!remoteBytes && !hasLocal) throw bad(`${what} has neither remote nor local code`);

  // The agent's settings, and the environment Envoy gets without them.
  const envBytes = lenValue(vm, VM_ENV);
  const agentKeys = new Map<string, string>();
  let envForEnvoy = envBytes;
  if (envBytes) {
    const env = fieldsOf(envBytes, `${what} environment_variables`);
    const kept = env.filter((f) => {
      if (f.field !== ENV_KEY_VALUES || f.wt !== WT_LEN) return true;
      const entry = fieldsOf(f.value, `${what} environment_variables entry`);
      const key = lenValue(entry, 1)?.toString('utf8') ?? '';
      if (!key.startsWith(AGENT_ENV_PREFIX)) return true;
      agentKeys.set(key, lenValue(entry, 2)?.toString('utf8') ?? '');
      return false;
    });
    // Go drops environment_variables when nothing is left in it.
    envForEnvoy = kept.length ? Buffer.concat(kept.map((f) => f.raw)) : undefined;
  }
  const rebuild = (newCode: Buffer | undefined): Buffer => {
    let vmOut = replaced(vm, VM_ENV, envForEnvoy);
    if (newCode) vmOut = replaced(fieldsOf(vmOut, 'vm_config'), VM_CODE, newCode);
    const pcOut = replaced(pc, PC_VM_CONFIG, vmOut);
    const wasmOut = replaced(wasm, WASM_CONFIG, pcOut);
    const tcOut = replaced(tc, ANY_VALUE, wasmOut);
    const tecOut = replaced(tec, TEC_TYPED_CONFIG, tcOut);
    return replaced(outer, ANY_VALUE, tecOut);
  };
  if (!remoteBytes) {
    return { kind: 'passthrough', name, any: agentKeys.size ? rebuild(undefined) : any, why: 'local' };
  }

  const remote = fieldsOf(remoteBytes, `${what} remote code`);
  const uriBytes = lenValue(remote, RDS_HTTP_URI);
  let url: string | undefined;
  let timeoutMs: number | undefined;
  if (uriBytes) {
    const uri = fieldsOf(uriBytes, `${what} http_uri`);
    url = lenValue(uri, URI_URI)?.toString('utf8') ?? '';
    const t = lenValue(uri, URI_TIMEOUT);
    if (t) {
      const d = fieldsOf(t, `${what} http_uri.timeout`);
      timeoutMs = varintValue(d, 1) * 1000 + Math.floor(varintValue(d, 2) / 1e6);
    }
  }
  let sha256 = lenValue(remote, RDS_SHA256)?.toString('utf8') ?? '';
  if (sha256 === 'nil') sha256 = ''; // istiod's placeholder for "not set"
  const policy = varintValue(pc, PC_FAILURE_POLICY);
  const failOpen = policy !== 0 ? policy === FAILURE_POLICY_FAIL_OPEN : varintValue(pc, PC_FAIL_OPEN) !== 0;
  const rv: RemoteWasm = {
    resourceName: name,
    configName,
    network,
    url,
    sha256,
    timeoutMs,
    pullSecret: agentKeys.get(WASM_SECRET_ENV),
    pullPolicy: PULL_POLICIES[agentKeys.get(WASM_POLICY_ENV) ?? ''] ?? 'Unspecified',
    resourceVersion: agentKeys.get(WASM_RESOURCE_VERSION_ENV) ?? '',
    failOpen,
  };
  return {
    kind: 'remote',
    name,
    wasm: rv,
    withLocalFile: (filename) => rebuild(lenField(ADS_LOCAL, lenField(DS_FILENAME, filename))),
    standIn: () => standInFilter(name, network, failOpen),
  };
}

/**
 * Go's fallback for a module that cannot be had: an RBAC filter under the plugin's name that allows everything
 * (no rules) or denies everything (empty rules), as a TypedExtensionConfig Any.
 */
export function standInFilter(name: string, network: boolean, allow: boolean): Buffer {
  const prefix = allow ? ALLOW_STAT_PREFIX : DENY_STAT_PREFIX;
  const rules = allow ? Buffer.alloc(0) : lenField(1, Buffer.alloc(0)); // rules = 1 in both RBAC filters
  // http RBAC: rules_stat_prefix = 6; network RBAC: stat_prefix = 3.
  const rbac = Buffer.concat([rules, lenField(network ? 3 : 6, prefix)]);
  const typed = Buffer.concat([
    lenField(ANY_TYPE, network ? RBAC_NETWORK_TYPE : RBAC_HTTP_TYPE),
    lenField(ANY_VALUE, rbac),
  ]);
  const tec = Buffer.concat([lenField(TEC_NAME, name), lenField(TEC_TYPED_CONFIG, typed)]);
  return Buffer.concat([lenField(ANY_TYPE, EXTENSION_CONFIG_TYPE), lenField(ANY_VALUE, tec)]);
}

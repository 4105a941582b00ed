// WasmPlugin reader (extensions.istio.io/v1alpha1): a Wasm module the proxies it selects run as an HTTP (or
// network) filter, served over ECDS by ./gen-wasm.ts. Checked as istiod's ValidateWasmPlugin does
// (pkg/config/validation/validation.go): url scheme oci/http/https/file (none means oci), sha256 as 64 lowercase hex,
// selector and targetRefs not both, env names unique with a value only when inline, match ports in range.
// targetRefs: Gateway API Gateways only (a waypoint's Service targets have no meaning without ambient).

import type { WasmPhase, WasmPluginSpec, WorkloadMode } from './model';
import { DNS_NAME, type Path, type Reader } from './schema';

const FIELDS = [
  'selector',
  'targetRef',
  'targetRefs',
  'phase',
  'priority',
  'url',
  'sha256',
  'imagePullPolicy',
  'imagePullSecret',
  'pluginConfig',
  'pluginName',
  'failStrategy',
  'vmConfig',
  'match',
  'type',
  'verificationKey',
];
const SCHEMES = ['oci:', 'http:', 'https:', 'file:'];
const GATEWAY_GROUP = 'gateway.networking.k8s.io';
const FAIL_STRATEGIES = ['FAIL_CLOSE', 'FAIL_OPEN', 'FAIL_RELOAD'] as const;
const SHA256 = { pattern: /^[a-f0-9]{64}$/, patternText: '64 lowercase hex digits' };

export function readWasmPlugin(r: Reader, v: unknown, path: Path): WasmPluginSpec | undefined {
  const o = r.object(v, path, FIELDS, ['url']);
  if (!o) return r.fail(path, 'is required');
  if (o.verificationKey !== undefined) r.fail([...path, 'verificationKey'], 'is not supported (Istio ignores it too)');
  const url = readUrl(r, o.url, [...path, 'url']);
  const out: WasmPluginSpec = {
    url: url ?? '',
    phase:
      r.oneOf(o.phase, [...path, 'phase'], [
        'UNSPECIFIED_PHASE',
        'AUTHN',
        'AUTHZ',
        'STATS',
      ] as const satisfies readonly WasmPhase[]) ?? 'UNSPECIFIED_PHASE',
    imagePullPolicy:
      r.oneOf(o.imagePullPolicy, [...path, 'imagePullPolicy'], [
        'UNSPECIFIED_POLICY',
        'IfNotPresent',
        'Always',
      ] as const) ?? 'UNSPECIFIED_POLICY',
    failStrategy: r.oneOf(o.failStrategy, [...path, 'failStrategy'], FAIL_STRATEGIES) ?? 'FAIL_CLOSE',
    type: (
      r.oneOf(o.type, [...path, 'type'], ['UNSPECIFIED_PLUGIN_TYPE', 'HTTP', 'NETWORK'] as const) ?? 'HTTP'
    ).replace('UNSPECIFIED_PLUGIN_TYPE', 'HTTP') as WasmPluginSpec['type'],
    env: [],
    match: [],
  };
  const priority = r.int(o.priority, [...path, 'priority'], { min: -(2 ** 31), max: 2 ** 31 - 1 });
  if (priority !== undefined) out.priority = priority;
  const sha = r.string(o.sha256, [...path, 'sha256'], SHA256);
  if (sha) out.sha256 = sha;
  const secret = r.string(o.imagePullSecret, [...path, 'imagePullSecret']);
  if (secret) {
    // istiod resolves it in the plugin's own namespace whatever namespace is written (`ns/name` keeps `name`).
    const name = secret.slice(secret.lastIndexOf('/') + 1);
    if (!DNS_NAME.test(name)) r.fail([...path, 'imagePullSecret'], `"${secret.slice(0, 253)}" is not a Secret name`);
    else out.imagePullSecret = name;
  }
  const pluginName = r.string(o.pluginName, [...path, 'pluginName']);
  if (pluginName !== undefined && pluginName.length > 256) {
    r.fail([...path, 'pluginName'], 'is longer than 256 characters');
  } else if (pluginName) out.pluginName = pluginName;
  if (o.pluginConfig !== undefined && o.pluginConfig !== null) {
    const pc = r.mapping(o.pluginConfig, [...path, 'pluginConfig']);
    if (pc && Object.keys(pc).length) out.pluginConfigJson = JSON.stringify(pc);
  }
  readSelection(r, o, path, out);
  readVmConfig(r, o.vmConfig, [...path, 'vmConfig'], out);
  readMatch(r, o.match, [...path, 'match'], out);
  return out;
}

function readUrl(r: Reader, v: unknown, path: Path): string | undefined {
  const s = r.string(v, path, { required: true });
  if (s === undefined) return undefined;
  const schemeMatch = /^([A-Za-z][A-Za-z0-9+.-]*):\/\//.exec(s);
  const scheme = schemeMatch ? `${schemeMatch[1].toLowerCase()}:` : 'oci:';
  if (!SCHEMES.includes(scheme)) {
    return r.fail(path, `scheme ${scheme.slice(0, -1)} is not one of oci, http, https, file`);
  }
  if (/\s/.test(s)) return r.fail(path, 'must not contain white space');
  try {
    const u = new URL(schemeMatch ? s : `oci://${s}`);
    if (scheme !== 'file:' && !u.hostname) return r.fail(path, 'has no host');
  } catch {
    return r.fail(path, `"${s.slice(0, 200)}" is not a URL`);
  }
  return s;
}

function readSelection(r: Reader, o: Record<string, unknown>, path: Path, out: WasmPluginSpec): void {
  if (o.selector !== undefined && o.selector !== null) {
    const s = r.object(o.selector, [...path, 'selector'], ['matchLabels'], []);
    out.selector = r.stringMap(s?.matchLabels, [...path, 'selector', 'matchLabels']);
  }
  const refs: { v: unknown; path: Path }[] = [];
  if (o.targetRef !== undefined && o.targetRef !== null) refs.push({ v: o.targetRef, path: [...path, 'targetRef'] });
  const refsPath = [...path, 'targetRefs'];
  r.array(o.targetRefs, refsPath).forEach((t, i) => refs.push({ v: t, path: [...refsPath, i] }));
  if (o.targetRef !== undefined && o.targetRefs !== undefined) {
    r.fail([...path, 'targetRef'], 'targetRef and targetRefs are exclusive');
  }
  if (refs.length && out.selector) r.fail([...path, 'selector'], 'selector and targetRef(s) are exclusive');
  const names: string[] = [];
  for (const ref of refs) {
    const t = r.object(ref.v, ref.path, ['group', 'kind', 'name', 'namespace'], ['kind', 'name']);
    if (!t) continue;
    const group = r.string(t.group, [...ref.path, 'group']) ?? '';
    const kind = r.string(t.kind, [...ref.path, 'kind'], { required: true });
    const name = r.string(t.name, [...ref.path, 'name'], { required: true, pattern: DNS_NAME, patternText: 'a name' });
    if (t.namespace !== undefined) r.fail([...ref.path, 'namespace'], 'cross-namespace targets are not allowed');
    if (kind !== undefined && (kind !== 'Gateway' || group !== GATEWAY_GROUP)) {
      r.fail(ref.path, `only ${GATEWAY_GROUP} Gateways can be targeted here (not ${group || 'core'}/${kind})`);
    } else if (name) names.push(name);
  }
  if (names.length) out.targetGateways = names;
}

function readVmConfig(r: Reader, v: unknown, path: Path, out: WasmPluginSpec): void {
  const vm = r.object(v, path, ['env'], []);
  if (!vm) return;
  const env: { name: string; value: string; valueFrom: 'INLINE' | 'HOST' }[] = [];
  r.array(vm.env, [...path, 'env']).forEach((e, i) => {
    const ep = [...path, 'env', i];
    const eo = r.object(e, ep, ['name', 'value', 'valueFrom'], ['name']);
    if (!eo) return;
    const name = r.string(eo.name, [...ep, 'name'], { required: true });
    const valueFrom = r.oneOf(eo.valueFrom, [...ep, 'valueFrom'], ['INLINE', 'HOST'] as const) ?? 'INLINE';
    const value = r.string(eo.value, [...ep, 'value']) ?? '';
    if (name === undefined) return;
    if (name.length > 256) r.fail([...ep, 'name'], 'is longer than 256 characters');
    else if (name.startsWith('ISTIO_META_')) r.fail([...ep, 'name'], "ISTIO_META_ variables are the agent's");
    else if (env.some((x) => x.name === name)) r.fail([...ep, 'name'], `"${name}" is listed twice`);
    else if (valueFrom !== 'INLINE' && value) r.fail([...ep, 'value'], 'may only be set when valueFrom is INLINE');
    else env.push({ name, value, valueFrom });
  });
  out.env = env;
}

function readMatch(r: Reader, v: unknown, path: Path, out: WasmPluginSpec): void {
  const match: { mode: WorkloadMode; ports: number[] }[] = [];
  r.array(v, path).forEach((m, i) => {
    const mp = [...path, i];
    const mo = r.object(m, mp, ['mode', 'ports'], []);
    if (!mo) return r.fail(mp, 'must be a mapping');
    const mode = r.oneOf(mo.mode, [...mp, 'mode'], ['UNDEFINED', 'CLIENT', 'SERVER', 'CLIENT_AND_SERVER'] as const);
    const ports: number[] = [];
    r.array(mo.ports, [...mp, 'ports']).forEach((p, j) => {
      const po = r.object(p, [...mp, 'ports', j], ['number'], ['number']);
      const n = r.port(po?.number, [...mp, 'ports', j, 'number'], true);
      if (n !== undefined) ports.push(n);
    });
    match.push({ mode: mode ?? 'UNDEFINED', ports });
  });
  out.match = match;
}

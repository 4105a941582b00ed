// The accepted subset of Istio's networking API, in its own apiVersion/kind/metadata/spec form: each reader turns
// one parsed YAML document into a normalised Config, or reports what is wrong and where. Anything outside the
// subset is rejected with a message rather than ignored, so a user never believes a field took effect.

import { readDestinationRule } from './kind-destination-rule';
import { readGateway } from './kind-gateway';
import { readSecret, SECRET_TOP_KEYS } from './kind-secret';
import { readServiceEntry, readWorkload } from './kind-service-entry';
import { readSidecar } from './kind-sidecar';
import { readVirtualService } from './kind-virtual-service';
import { readWasmPlugin } from './kind-wasm-plugin';
import type { Config, Kind, PeerAuthenticationSpec } from './model';
import { KINDS } from './model';
import { DNS_LABEL, DNS_NAME, type Path, type Problem, Reader } from './schema';

const API_VERSIONS = ['networking.istio.io/v1', 'networking.istio.io/v1beta1', 'networking.istio.io/v1alpha3'];
const SECURITY_API_VERSIONS = ['security.istio.io/v1', 'security.istio.io/v1beta1'];
const EXTENSIONS_API_VERSIONS = ['extensions.istio.io/v1alpha1'];

export interface ReadResult {
  config?: Config;
  problems: Problem[];
}

/** Reads one document. The config is returned only when there is no problem at all. */
export function readDocument(doc: unknown): ReadResult {
  const r = new Reader();
  // A Secret is Kubernetes' core shape (type/data/stringData), not an Istio spec.
  const secret = (doc as { kind?: unknown } | null)?.kind === 'Secret';
  const top = secret
    ? r.object(doc, [], SECRET_TOP_KEYS, ['apiVersion', 'kind', 'metadata'])
    : r.object(doc, [], ['apiVersion', 'kind', 'metadata', 'spec'], ['apiVersion', 'kind', 'metadata', 'spec']);
  if (!top) return { problems: r.problems.length ? r.problems : [{ path: [], message: 'document is empty' }] };
  const kindText = r.string(top.kind, ['kind'], { required: true });
  if (kindText !== undefined && !(KINDS as readonly string[]).includes(kindText)) {
    r.fail(['kind'], `unknown or unsupported kind "${kindText}" (supported: ${KINDS.join(', ')})`);
  }
  const api = r.string(top.apiVersion, ['apiVersion'], { required: true });
  const apis =
    kindText === 'PeerAuthentication'
      ? SECURITY_API_VERSIONS
      : kindText === 'Secret'
        ? ['v1']
        : kindText === 'WasmPlugin'
          ? EXTENSIONS_API_VERSIONS
          : API_VERSIONS;
  if (api !== undefined && !apis.includes(api)) r.fail(['apiVersion'], `"${api}" is not one of ${apis.join(', ')}`);
  const md = r.object(
    top.metadata,
    ['metadata'],
    ['name', 'namespace', 'labels', 'annotations', 'resourceVersion', 'uid', 'generation', 'creationTimestamp'],
    ['name'],
  );
  const name = r.string(md?.name, ['metadata', 'name'], {
    required: true,
    pattern: DNS_NAME,
    patternText: 'a lowercase DNS name',
  });
  const namespace =
    r.string(md?.namespace, ['metadata', 'namespace'], { pattern: DNS_LABEL, patternText: 'a lowercase DNS label' }) ??
    'default';
  const labels = r.stringMap(md?.labels, ['metadata', 'labels']);
  r.stringMap(md?.annotations, ['metadata', 'annotations']);
  if (!kindText || !(KINDS as readonly string[]).includes(kindText)) return { problems: r.problems };
  const kind = kindText as Kind;
  const spec = kind === 'Secret' ? readSecret(r, top) : SPEC_READERS[kind](r, top.spec, ['spec'], namespace);
  if (r.problems.length || !name || spec === undefined) return { problems: r.problems };
  return { config: { meta: { kind, name, namespace, labels, resourceVersion: '' }, spec }, problems: [] };
}

type SpecReader = (r: Reader, v: unknown, path: Path, namespace: string) => Config['spec'] | undefined;

const SPEC_READERS: Record<Exclude<Kind, 'Secret'>, SpecReader> = {
  ServiceEntry: readServiceEntry,
  WorkloadEntry: (r, v, path) => readWorkload(r, v, path, 'STATIC', true),
  VirtualService: readVirtualService,
  DestinationRule: readDestinationRule,
  Gateway: readGateway,
  Sidecar: readSidecar,
  PeerAuthentication: readPeerAuthentication,
  WasmPlugin: readWasmPlugin,
};

function readPeerAuthentication(r: Reader, v: unknown, path: Path): PeerAuthenticationSpec | undefined {
  const o = r.object(v, path, ['selector', 'mtls'], []) ?? {};
  let selector: Record<string, string> | undefined;
  if (o.selector !== undefined) {
    const s = r.object(o.selector, [...path, 'selector'], ['matchLabels'], ['matchLabels']);
    selector = r.stringMap(s?.matchLabels, [...path, 'selector', 'matchLabels']);
  }
  const m = r.object(o.mtls, [...path, 'mtls'], ['mode'], []);
  const mode =
    r.oneOf(m?.mode, [...path, 'mtls', 'mode'], ['STRICT', 'PERMISSIVE', 'DISABLE'] as const, {
      unsupported: ['UNSET'],
    }) ?? 'PERMISSIVE';
  const out: PeerAuthenticationSpec = { mode };
  if (selector) out.selector = selector;
  return out;
}

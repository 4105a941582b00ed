// Secret reader: gateway credentials without Kubernetes. A `kind: Secret` (apiVersion v1) document in the config
// directory, in the shapes Istio reads from Kubernetes (istio/istio 86c9f01f, pilot/pkg/credentials/kube/secrets.go):
// `tls.crt`/`tls.key`/`ca.crt` (type kubernetes.io/tls) or the generic `cert`/`key`/`cacert`, in `data` (base64) or
// `stringData` (text). Checked at load: every PEM block parses, and the key belongs to the certificate. Messages
// name the field only: key material never reaches a log line. Also image pull secrets (type
// kubernetes.io/dockerconfigjson, `.dockerconfigjson`) for a WasmPlugin's imagePullSecret (./gen-wasm.ts).

import { createPrivateKey, X509Certificate } from 'node:crypto';
import type { SecretSpec } from './model';
import type { Path, Reader } from './schema';

export const SECRET_TOP_KEYS = ['apiVersion', 'kind', 'metadata', 'type', 'data', 'stringData', 'immutable'] as const;
const TYPES = ['kubernetes.io/tls', 'Opaque', 'kubernetes.io/dockerconfigjson'] as const;
const DOCKER_CONFIG = '.dockerconfigjson';
// Field names per role, Kubernetes' TLS form first (Istio's order of lookup).
const CERT_KEYS = ['tls.crt', 'cert'];
const KEY_KEYS = ['tls.key', 'key'];
const CA_KEYS = ['ca.crt', 'cacert'];

export function readSecret(r: Reader, top: Record<string, unknown>): SecretSpec | undefined {
  const type = r.oneOf(top.type, ['type'], TYPES);
  r.bool(top.immutable, ['immutable']);
  const fields = new Map<string, { text: string; path: Path }>();
  const data = r.mapping(top.data, ['data']) ?? {};
  for (const [k, v] of Object.entries(data)) {
    const s = r.string(v, ['data', k]);
    if (s === undefined) continue;
    const text = Buffer.from(s.replace(/\s+/g, ''), 'base64').toString('utf8');
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(s.replace(/\s+/g, '')))
      r.fail(['data', k], 'is not base64 (use stringData for PEM text)');
    else fields.set(k, { text, path: ['data', k] });
  }
  // As in Kubernetes, stringData wins over data for the same key.
  for (const [k, v] of Object.entries(r.mapping(top.stringData, ['stringData']) ?? {})) {
    const s = r.string(v, ['stringData', k]);
    if (s !== undefined) fields.set(k, { text: s, path: ['stringData', k] });
  }
  if (type === 'kubernetes.io/dockerconfigjson') return dockerConfig(r, fields.get(DOCKER_CONFIG));
  const pick = (keys: string[]) => keys.map((k) => fields.get(k)).find((f) => f !== undefined);
  const cert = pick(CERT_KEYS);
  const key = pick(KEY_KEYS);
  const ca = pick(CA_KEYS);
  if (!cert && !key && !ca)
    return r.fail([], 'a Secret for TLS needs tls.crt and tls.key (or cert and key), and/or ca.crt (or cacert)');
  if (!!cert !== !!key)
    return r.fail(
      cert ? cert.path : key!.path,
      `has no matching ${cert ? 'private key (tls.key or key)' : 'certificate (tls.crt or cert)'}`,
    );
  const out: SecretSpec = {};
  if (cert && key) {
    const leaf = certificates(r, cert.text, cert.path)[0];
    let pk: ReturnType<typeof createPrivateKey> | undefined;
    try {
      pk = createPrivateKey(key.text);
    } catch {
      r.fail(key.path, 'is not a PEM private key');
    }
    if (leaf && pk) {
      if (!leaf.checkPrivateKey(pk))
        r.fail(
          key.path,
          `does not match the certificate in ${cert.path.join('.')} (${leaf.subject ? `subject ${leaf.subject.replace(/\n/g, ', ')}` : (leaf.subjectAltName ?? 'no subject')})`,
        );
    }
    out.cert = cert.text;
    out.key = key.text;
  }
  if (ca) {
    certificates(r, ca.text, ca.path);
    out.ca = ca.text;
  }
  return out;
}

/** An image pull secret (a WasmPlugin's imagePullSecret): `.dockerconfigjson`, a JSON object with `auths`. */
function dockerConfig(r: Reader, f: { text: string; path: Path } | undefined): SecretSpec | undefined {
  if (!f) return r.fail([], `a kubernetes.io/dockerconfigjson Secret needs ${DOCKER_CONFIG} in data or stringData`);
  let doc: unknown;
  try {
    doc = JSON.parse(f.text);
  } catch {
    return r.fail(f.path, 'is not JSON');
  }
  const auths = (doc as { auths?: unknown } | null)?.auths;
  if (!auths || typeof auths !== 'object' || Array.isArray(auths)) return r.fail(f.path, 'has no "auths" mapping');
  return { dockerConfigJson: f.text };
}

/** Every CERTIFICATE block of a PEM text, parsed; a problem when there is none or one does not parse. */
function certificates(r: Reader, text: string, path: Path): X509Certificate[] {
  const blocks = text.match(/-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g) ?? [];
  if (!blocks.length) {
    r.fail(path, 'has no PEM certificate (-----BEGIN CERTIFICATE-----)');
    return [];
  }
  const out: X509Certificate[] = [];
  blocks.forEach((b, i) => {
    try {
      out.push(new X509Certificate(b));
    } catch (e) {
      r.fail(path, `certificate ${i + 1} does not parse: ${(e as Error).message}`);
    }
  });
  return out;
}

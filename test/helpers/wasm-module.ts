// A real proxy-wasm HTTP filter for tests, written in WAT and assembled with wabt's wat2wasm (installed on first
// use when missing, as dns.ts installs dnsmasq): it adds one response header, so a test that sees the header knows
// the module ran in Envoy. Also the ECDS resource (TypedExtensionConfig with a Wasm filter) istiod would send for a
// WasmPlugin, hand-encoded (the project's descriptor has no Wasm messages). Test code only.

import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import type { Resource } from './control-plane';
import { EXTENSION_CONFIG_TYPE, lenField, WASM_HTTP_TYPE, WASM_NETWORK_TYPE } from '../../lib/wasm-config';

export const ECDS = EXTENSION_CONFIG_TYPE;

function haveWat2wasm(): boolean {
  try {
    execFileSync('wat2wasm', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

function ensureWat2wasm(): void {
  if (haveWat2wasm()) return;
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  try {
    execFileSync('apt-get', ['install', '-y', '--no-install-recommends', 'wabt'], { stdio: 'inherit', env });
  } catch {
    execFileSync('apt-get', ['update'], { stdio: 'inherit', env });
    execFileSync('apt-get', ['install', '-y', '--no-install-recommends', 'wabt'], { stdio: 'inherit', env });
  }
  if (!haveWat2wasm()) throw new Error('wat2wasm (Debian package wabt) is needed to build the test Wasm module');
}

/** A proxy-wasm (ABI 0.2.1) module that adds `header: value` to every response. `pad` bytes make it larger. */
export function headerModule(header: string, value: string, pad = 0): Buffer {
  ensureWat2wasm();
  const esc = (s: string) => [...Buffer.from(s)].map((b) => `\\${b.toString(16).padStart(2, '0')}`).join('');
  const hlen = Buffer.byteLength(header);
  const vlen = Buffer.byteLength(value);
  const wat = `(module
  (import "env" "proxy_add_header_map_value" (func $add (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 16) "${esc(header)}")
  (data (i32.const 512) "${esc(value)}")
  ${pad ? `(data (i32.const 4096) "${'\\00'.repeat(pad)}")` : ''}
  (global $heap (mut i32) (i32.const ${4096 + pad + 1024}))
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param $size i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.and (i32.add (i32.add (global.get $heap) (local.get $size)) (i32.const 7)) (i32.const -8)))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow (i32.add (i32.div_u (global.get $heap) (i32.const 65536)) (i32.const 1))))))
    (local.get $p))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
    (drop (call $add (i32.const 2) (i32.const 16) (i32.const ${hlen}) (i32.const 512) (i32.const ${vlen})))
    (i32.const 0))
  (func (export "proxy_on_done") (param i32) (result i32) (i32.const 1))
  (func (export "proxy_on_log") (param i32))
  (func (export "proxy_on_delete") (param i32))
)`;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pa-wat-'));
  try {
    fs.writeFileSync(path.join(dir, 'm.wat'), wat);
    execFileSync('wat2wasm', [path.join(dir, 'm.wat'), '-o', path.join(dir, 'm.wasm')], { stdio: 'pipe' });
    return fs.readFileSync(path.join(dir, 'm.wasm'));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

export interface WasmPluginResource {
  url: string;
  sha256?: string;
  /** envoy.extensions.wasm.v3.FailurePolicy: FAIL_CLOSED (2) or FAIL_OPEN (3); unset: fail_open false. */
  failurePolicy?: 'FAIL_OPEN' | 'FAIL_CLOSED';
  /** vm_config.environment_variables.key_values (istiod puts ISTIO_META_WASM_* here). */
  env?: Record<string, string>;
  /** A network (L4) Wasm filter instead of an HTTP one. */
  network?: boolean;
}

/** The ECDS resource istiod builds for a WasmPlugin (pilot/pkg/model/extensions.go), named `name`. */
export function wasmPluginResource(name: string, p: WasmPluginResource): Resource {
  const varint = (field: number, v: number) => Buffer.from([field << 3, v]);
  const uri = Buffer.concat([lenField(1, p.url), lenField(2, '_'), lenField(3, Buffer.from([0x08, 30]))]);
  const remote = Buffer.concat([lenField(1, uri), lenField(2, p.sha256 ?? 'nil')]);
  const env = Buffer.concat(
    Object.entries(p.env ?? {}).map(([k, v]) => lenField(2, Buffer.concat([lenField(1, k), lenField(2, v)]))),
  );
  const vm = Buffer.concat([
    lenField(2, 'envoy.wasm.runtime.v8'),
    lenField(3, lenField(2, remote)),
    ...(p.env ? [lenField(7, env)] : []),
  ]);
  const policy = p.failurePolicy ? [varint(7, p.failurePolicy === 'FAIL_OPEN' ? 3 : 2)] : [];
  // The order istiod's (Go's) marshalling writes: the vm oneof after the plain fields.
  const pc = Buffer.concat([lenField(1, name), ...policy, lenField(3, vm)]);
  const typed = Buffer.concat([lenField(1, p.network ? WASM_NETWORK_TYPE : WASM_HTTP_TYPE), lenField(2, lenField(1, pc))]);
  return {
    name,
    any: { type_url: EXTENSION_CONFIG_TYPE, value: Buffer.concat([lenField(1, name), lenField(2, typed)]) },
  };
}

/** The inputs of test/golden/wasm-go-convert.json (scripts/wasm-go-golden.ts): HTTP and network, both policies. */
export const WASM_GOLDEN_FILE = path.join(__dirname, '..', 'golden', 'wasm-go-convert.json');
export const WASM_GOLDEN_CASES = {
  localFile: '/var/lib/istio/data/m.wasm',
  names: ['http fail-open', 'http fail-closed with agent keys', 'oci, policy Always, own env kept', 'network fail-open', 'network, no policy'],
};

export function wasmGoldenInput(): Buffer[] {
  const cases = [
    wasmPluginResource('ns.a', { url: 'http://h/a.wasm', sha256: 'ab', failurePolicy: 'FAIL_OPEN' }),
    wasmPluginResource('ns.b', { url: 'http://h/b.wasm', failurePolicy: 'FAIL_CLOSED', env: { ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION: '3' } }),
    wasmPluginResource('ns.c', { url: 'oci://r/c:1', env: { ISTIO_META_WASM_IMAGE_PULL_POLICY: 'Always', KEEP: 'v' } }),
    wasmPluginResource('ns.d', { url: 'http://h/d.wasm', network: true, failurePolicy: 'FAIL_OPEN' }),
    wasmPluginResource('ns.e', { url: 'http://h/e.wasm', network: true }),
  ];
  return cases.map((r) => Buffer.concat([lenField(1, r.any.type_url), lenField(2, Buffer.from(r.any.value))]));
}

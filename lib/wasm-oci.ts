// Fetching a Wasm module from an OCI registry (`oci://registry/repo:tag` or `@sha256:...`), for the Wasm cache.
//
// Contract shared by the cache (lib/wasm-cache.ts and friends) and this file; the body is being built.

/** What the cache asks for. */
export interface OciFetchOptions {
  /** Docker config JSON (`{"auths":{...}}`) from the plugin's pull secret, if any. */
  pullSecret?: Buffer;
  /** Registries (host or host:port) reached over plain HTTP and/or without TLS verification. */
  insecure: boolean;
  /** Per-request timeout and retries of the whole fetch. */
  timeoutMs: number;
  maxRetries: number;
  /** The module (and any layer read) may not be larger than this. */
  maxBytes: number;
  /** Refuse to connect to addresses in these CIDRs (SSRF block list); checked on every resolved address. */
  isBlocked(address: string): boolean;
  signal?: AbortSignal;
}

export interface OciModule {
  /** The Wasm module bytes. */
  module: Buffer;
  /** The image's manifest digest, `sha256:<hex>` (what a WasmPlugin's `sha256` names for an OCI image, as in Go). */
  manifestDigest: string;
}

export async function fetchOciModule(_ref: string, _opts: OciFetchOptions): Promise<OciModule> {
  throw new Error('OCI Wasm fetch is not built yet');
}

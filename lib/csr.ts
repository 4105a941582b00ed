// A workload key and its certificate signing request: URI SAN spiffe://<trust domain>/ns/<ns>/sa/<sa>, empty
// subject (no CN), as Istio's CA expects. Pure: values in, values out (no files, clock or environment).
//
// The PKCS#10 request is DER-encoded here (RFC 2986: about a dozen fixed structures) and signed with node:crypto:
// loading a general ASN.1/X.509 library cost more than the rest of the first certificate's path (hundreds of ms
// at start-up), and the key pair is made on libuv's thread pool, so the event loop never waits for an RSA prime.

import { generateKeyPair, generateKeyPairSync, sign, type KeyObject } from 'node:crypto';
import { promisify } from 'node:util';
import * as envs from './env';
import type { Env } from './env';
import { AgentError } from './errors';

/** ECDSA's curve defaults to P-256 (Istio's ECC_CURVE default). */
export type KeyAlgorithm = { kind: 'ECDSA'; curve?: EccCurve } | { kind: 'RSA'; bits: number };
export type EccCurve = 'P256' | 'P384';

export interface KeyAndCsr {
  /** PEM private key: SEC1/PKCS#1 as Istio writes by default, PKCS#8 when asked. */
  keyPem: string;
  csrPem: string;
}

export function spiffeId(trustDomain: string, namespace: string, serviceAccount: string): string {
  return `spiffe://${trustDomain}/ns/${namespace}/sa/${serviceAccount}`;
}

/**
 * ECC_SIGNATURE_ALGORITHM=ECDSA picks ECDSA on ECC_CURVE (P256 or P384); anything else set there is refused;
 * otherwise RSA of rsaBits. Istio takes any ECC_CURVE but P384 as P256; here a curve it would not honour is an error
 * (a P521 request silently served with P-256 keys is the surprise the variable registry exists to prevent).
 */
/** keyAlgorithm() of ECC_SIGNATURE_ALGORITHM, WORKLOAD_RSA_KEY_SIZE and ECC_CURVE as `env` sets them. */
export function workloadKeyAlgorithm(env: Env): KeyAlgorithm {
  return keyAlgorithm(
    envs.ECC_SIGNATURE_ALGORITHM.get(env),
    envs.WORKLOAD_RSA_KEY_SIZE.get(env),
    envs.ECC_CURVE.get(env),
  );
}

export function keyAlgorithm(eccSignatureAlgorithm: string, rsaBits: number, eccCurve = 'P256'): KeyAlgorithm {
  const ecc = eccSignatureAlgorithm.trim().toUpperCase();
  if (ecc === 'ECDSA') {
    const curve = eccCurve.trim().toUpperCase();
    if (curve !== 'P256' && curve !== 'P384') {
      throw new AgentError('CONFIG_INVALID', `invalid ECC_CURVE "${eccCurve}" (want P256 or P384)`);
    }
    return { kind: 'ECDSA', curve };
  }
  if (ecc !== '')
    throw new AgentError(
      'CONFIG_INVALID',
      `invalid ECC_SIGNATURE_ALGORITHM "${eccSignatureAlgorithm}" (want ECDSA or unset)`,
    );
  if (![2048, 3072, 4096].includes(rsaBits))
    throw new AgentError('CONFIG_INVALID', `invalid WORKLOAD_RSA_KEY_SIZE ${rsaBits} (want 2048, 3072 or 4096)`);
  return { kind: 'RSA', bits: rsaBits };
}

// DER: tag, length (short or long form), contents.
function der(tag: number, ...parts: Buffer[]): Buffer {
  const body = Buffer.concat(parts);
  const n = body.length;
  const len = n < 0x80 ? Buffer.from([n]) : n < 0x100 ? Buffer.from([0x81, n]) : Buffer.from([0x82, n >> 8, n & 0xff]);
  if (n > 0xffff) throw new AgentError('INTERNAL', 'CSR field over 64 KiB');
  return Buffer.concat([Buffer.from([tag]), len, body]);
}

function oid(dotted: string): Buffer {
  const [a, b, ...rest] = dotted.split('.').map(Number) as [number, number, ...number[]];
  const bytes = [40 * a + b];
  for (const v of rest) {
    const groups: number[] = [];
    let x = v;
    do {
      groups.unshift(x & 0x7f);
      x = Math.floor(x / 128);
    } while (x > 0);
    bytes.push(...groups.map((g, i) => (i < groups.length - 1 ? g | 0x80 : g)));
  }
  return der(0x06, Buffer.from(bytes));
}

const SEQ = 0x30;
const SET = 0x31;
const OID_EXTENSION_REQUEST = '1.2.840.113549.1.9.14';
const OID_SUBJECT_ALT_NAME = '2.5.29.17';
// The hash follows the key as Go's x509.CreateCertificateRequest picks it (Istio's CSR template leaves it unset):
// SHA-256 for RSA and P-256, SHA-384 for P-384.
const SIGNATURE = {
  // sha256WithRSAEncryption, NULL parameters
  RSA: { hash: 'sha256', algorithm: der(SEQ, oid('1.2.840.113549.1.1.11'), Buffer.from([0x05, 0x00])) },
  P256: { hash: 'sha256', algorithm: der(SEQ, oid('1.2.840.10045.4.3.2')) }, // ecdsa-with-SHA256, no parameters
  P384: { hash: 'sha384', algorithm: der(SEQ, oid('1.2.840.10045.4.3.3')) }, // ecdsa-with-SHA384, no parameters
};
const NAMED_CURVE: Record<EccCurve, string> = { P256: 'prime256v1', P384: 'secp384r1' };

/** PKCS#10 with an empty subject and one critical SAN extension holding the URI, signed as SIGNATURE says. */
export function csrDer(identity: string, publicKeyDer: Buffer, privateKey: KeyObject, alg: KeyAlgorithm): Buffer {
  const uri = der(0x86, Buffer.from(identity, 'ascii')); // GeneralName uniformResourceIdentifier [6] IA5String
  const san = der(SEQ, oid(OID_SUBJECT_ALT_NAME), der(0x01, Buffer.from([0xff])), der(0x04, der(SEQ, uri)));
  const attributes = der(0xa0, der(SEQ, oid(OID_EXTENSION_REQUEST), der(SET, der(SEQ, san))));
  const info = der(SEQ, der(0x02, Buffer.from([0])), der(SEQ), publicKeyDer, attributes);
  const sig = SIGNATURE[alg.kind === 'RSA' ? 'RSA' : (alg.curve ?? 'P256')];
  const signature = sign(sig.hash, info, privateKey); // ECDSA: DER (r, s), as X.509 wants
  return der(SEQ, info, sig.algorithm, der(0x03, Buffer.from([0]), signature));
}

const generate = promisify(generateKeyPair);

const ecParams = (a: { curve?: EccCurve }) => ({ namedCurve: NAMED_CURVE[a.curve ?? 'P256'] });

function newKeyPair(a: KeyAlgorithm): Promise<{ publicKey: KeyObject; privateKey: KeyObject }> {
  return a.kind === 'ECDSA'
    ? generate('ec', ecParams(a))
    : generate('rsa', { modulusLength: a.bits, publicExponent: 0x10001 });
}

// The first workload key, started as soon as the agent knows it will ask a CA: an RSA key takes 70-250 ms of the
// thread pool, which then overlaps Envoy's start and the agent's module loading instead of following them.
type KeyPair = { publicKey: KeyObject; privateKey: KeyObject };
let pregenerated: { algorithm: string; pair: Promise<KeyPair>; made?: KeyPair } | undefined;

/** Started by the executable's main script before the bundle loaded (scripts/sea-main.js), in the default case. */
type EarlyKey = { algorithm: string; pair: Promise<KeyPair> };
const EARLY_KEY = '__pilotAgentEarlyKey';

export function pregenerateKey(a: KeyAlgorithm): void {
  const g = globalThis as { [EARLY_KEY]?: EarlyKey };
  const early = g[EARLY_KEY];
  if (early) {
    delete g[EARLY_KEY];
    if (early.algorithm === JSON.stringify(a)) {
      pregenerated = { algorithm: early.algorithm, pair: early.pair };
      return;
    }
  }
  if (pregenerated?.algorithm === JSON.stringify(a)) return; // on its way already
  // An ECDSA key is made at once (well under a millisecond, plus OpenSSL's key set-up the first time): on the thread
  // pool its answer would wait for a turn of the event loop, which start-up's module loading holds for tens of ms.
  let pair: Promise<KeyPair>;
  let made: KeyPair | undefined;
  try {
    if (a.kind === 'ECDSA') pair = Promise.resolve((made = generateKeyPairSync('ec', ecParams(a))));
    else pair = newKeyPair(a);
  } catch (e) {
    pair = Promise.reject(e);
  }
  pair.catch(() => undefined); // a failure is met again, and reported, by the first CSR
  pregenerated = { algorithm: JSON.stringify(a), pair, made };
}

/** The pregenerated pair, once, when it is of the algorithm asked for. */
async function takePregenerated(a: KeyAlgorithm): Promise<KeyPair | undefined> {
  const p = pregenerated;
  pregenerated = undefined;
  if (!p || p.algorithm !== JSON.stringify(a)) return undefined;
  return p.pair.catch(() => undefined);
}

function checkIdentity(identity: string): void {
  if (!/^[\x21-\x7e]+$/.test(identity))
    throw new AgentError('INTERNAL', `identity ${JSON.stringify(identity)} is not an IA5 URI`);
}

function keyAndCsr(o: { identity: string; algorithm: KeyAlgorithm; pkcs8?: boolean }, pair: KeyPair): KeyAndCsr {
  const { publicKey, privateKey } = pair;
  const spki = publicKey.export({ type: 'spki', format: 'der' });
  const csr = csrDer(o.identity, spki, privateKey, o.algorithm);
  const type = o.pkcs8 ? 'pkcs8' : o.algorithm.kind === 'ECDSA' ? 'sec1' : 'pkcs1';
  const b64 = csr.toString('base64').replace(/.{64}/g, '$&\n').replace(/\n$/, '');
  return {
    keyPem: privateKey.export({ type, format: 'pem' }) as string,
    csrPem: `-----BEGIN CERTIFICATE REQUEST-----\n${b64}\n-----END CERTIFICATE REQUEST-----\n`,
  };
}

/**
 * The key and CSR made now, synchronously, from a pregenerated key already made (ECDSA) of this algorithm; else
 * undefined (generateKeyAndCsr then). At start-up the CA request then goes out in the same turn: each await before
 * it let module loading queued meanwhile (the bundle's imports are microtasks) run first, 15-30 ms.
 */
export function keyAndCsrNow(o: { identity: string; algorithm: KeyAlgorithm; pkcs8?: boolean }): KeyAndCsr | undefined {
  const p = pregenerated;
  if (!p?.made || p.algorithm !== JSON.stringify(o.algorithm)) return undefined;
  pregenerated = undefined;
  checkIdentity(o.identity);
  return keyAndCsr(o, p.made);
}

export async function generateKeyAndCsr(o: {
  identity: string;
  algorithm: KeyAlgorithm;
  pkcs8?: boolean;
}): Promise<KeyAndCsr> {
  checkIdentity(o.identity);
  return keyAndCsr(o, (await takePregenerated(o.algorithm)) ?? (await newKeyPair(o.algorithm)));
}

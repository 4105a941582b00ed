// The two decisions behind the SDS server's file names, on their own: which names a listener or cluster references
// (only SdsSecretConfig names, also inside transport-socket wrappers the descriptor lacks; never a lookalike string
// elsewhere in the resource), and what lib/named-file.ts reads (regular files of bounded size, never blocking on a
// FIFO, and only what the SDS client's uid could read itself).

import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { messageType, packAny } from '../lib/envoy-protos';
import { readNamedFile, socketReader } from '../lib/named-file';
import { SecretReferences, sdsNamesInJson } from '../lib/secret-names';
import { fileSecretNames } from '../lib/xds-secret-names';
import { tempDir } from './helpers/harness';

/** The error a promise rejects with, matched against `re` (uvu has no assert.rejects). */
async function rejects(p: Promise<unknown>, re: RegExp, msg?: string): Promise<void> {
  const err = await p.then(() => undefined, (e: Error) => e);
  assert.ok(err, msg ?? `expected a rejection matching ${re}`);
  assert.match(err!.message, re, msg);
}

const SDS = { api_config_source: { api_type: 'GRPC', grpc_services: [{ envoy_grpc: { cluster_name: 'sds-grpc' } }] } };
const anyBytes = (a: { type_url: string; value: Uint8Array }) => Buffer.from(messageType('google.protobuf.Any').encode(a).finish());
const upstreamTls = (cert: string, root: string) => packAny('envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext', {
  common_tls_context: {
    tls_certificate_sds_secret_configs: [{ name: cert, sds_config: SDS }],
    combined_validation_context: { default_validation_context: {}, validation_context_sds_secret_config: { name: root, sds_config: SDS } },
  },
});

function lengthDelimited(field: number, body: Buffer): Buffer {
  const len: number[] = [];
  let n = body.length;
  do {
    len.push((n & 0x7f) | (n > 0x7f ? 0x80 : 0));
    n >>>= 7;
  } while (n);
  return Buffer.concat([Buffer.from([(field << 3) | 2, ...len]), body]);
}

test('a cluster references the SdsSecretConfig names of its transport sockets, wrapped or not, and nothing else', () => {
  const cluster = packAny('envoy.config.cluster.v3.Cluster', {
    name: 'c',
    // A string that looks like a name, where a name is no SDS reference: not collected.
    metadata: { filter_metadata: { istio: { fields: { note: { string_value: 'file-root:/etc/shadow' } } } } },
    transport_socket: { name: 'tls', typed_config: upstreamTls('file-cert:/a.pem~/a.key', 'file-root:/ca.pem') },
    transport_socket_matches: [{ name: 'm', match: {}, transport_socket: { name: 'tls', typed_config: upstreamTls('default', 'file-root:system') } }],
  });
  assert.equal(fileSecretNames(anyBytes(cluster)).sort(), ['file-cert:/a.pem~/a.key', 'file-root:/ca.pem', 'file-root:system']);
  // envoy.transport_sockets.internal_upstream (not in the descriptor) wraps a TransportSocket in field 3.
  const inner = Buffer.from(messageType('envoy.config.core.v3.TransportSocket').encode(messageType('envoy.config.core.v3.TransportSocket').fromObject({ name: 'tls', typed_config: upstreamTls('file-cert:/w.pem~/w.key', 'ROOTCA') })).finish());
  const wrapped = packAny('envoy.config.cluster.v3.Cluster', {
    name: 'w',
    transport_socket: { name: 'iu', typed_config: { type_url: 'type.googleapis.com/envoy.extensions.transport_sockets.internal_upstream.v3.InternalUpstreamTransport', value: lengthDelimited(3, inner) } },
  });
  assert.equal(fileSecretNames(anyBytes(wrapped)), ['file-cert:/w.pem~/w.key']);
  // An unknown type holding such bytes: not followed (the name is not served, and the refusal is logged).
  const unknown = packAny('envoy.config.cluster.v3.Cluster', { name: 'u', transport_socket: { name: 'x', typed_config: { type_url: 'type.googleapis.com/example.Unknown', value: lengthDelimited(1, inner) } } });
  assert.equal(fileSecretNames(anyBytes(unknown)), []);
  assert.equal(fileSecretNames(Buffer.from('file-cert:garbage')), [], 'malformed bytes give no names and no exception');
});

test('references are counted per source: a source that changes or goes away takes exactly its names', () => {
  const r = new SecretReferences();
  const added: string[][] = [];
  r.onAdded((n) => added.push(n));
  r.set('bootstrap', ['default', 'file-root:/a']);
  r.set('xds/1/cds', ['file-root:/a', 'file-root:/b']);
  assert.equal(added, [['file-root:/a'], ['file-root:/b']], 'workload names need no reference; a name is added once');
  r.set('xds/1/cds', ['file-root:/c']);
  assert.ok(r.has('file-root:/a') && !r.has('file-root:/b') && r.has('file-root:/c'));
  r.set('bootstrap', []);
  r.set('xds/1/cds', []);
  assert.is(r.size, 0);
  assert.equal([...sdsNamesInJson({ clusters: [{ transport_socket: { typed_config: { common_tls_context: { tls_certificate_sds_secret_configs: [{ name: 'file-cert:/x~/y', sds_config: {} }] } } } }] })], ['file-cert:/x~/y']);
});

test('named files: a FIFO is refused at once (never opened), a device and a file over the cap are refused', async () => {
  const dir = tempDir('pa-named-');
  try {
    const fifo = path.join(dir.path, 'fifo');
    execFileSync('mkfifo', [fifo]);
    const t = performance.now();
    await rejects(readNamedFile(fifo), /a FIFO, not a regular file/);
    assert.ok(performance.now() - t < 1000);
    await rejects(readNamedFile('/dev/zero'), /a character device, not a regular file/);
    await rejects(readNamedFile(dir.path), /a directory, not a regular file/);
    const big = path.join(dir.path, 'big');
    fs.writeFileSync(big, Buffer.alloc(2048, 1));
    await rejects(readNamedFile(big, { maxBytes: 1024 }), /2048 bytes, more than the 1024 allowed/);
    assert.is((await readNamedFile(big, { maxBytes: 4096 })).length, 2048);
  } finally {
    dir.cleanup();
  }
});

test('named files for another uid: its mode bits and every directory on the real path decide, symlinks followed', async () => {
  const dir = tempDir('pa-named-uid-');
  try {
    fs.chmodSync(dir.path, 0o755);
    const reader = { uid: 65534, gid: 65534, what: 'uid 65534' };
    const put = (name: string, mode: number, uid = 0) => {
      const p = path.join(dir.path, name);
      fs.writeFileSync(p, 'x');
      fs.chmodSync(p, mode);
      fs.chownSync(p, uid, uid);
      return p;
    };
    const rootOnly = put('root-only', 0o600);
    const theirs = put('theirs', 0o600, 65534);
    const world = put('world', 0o644);
    await rejects(readNamedFile(rootOnly, { reader }), /not readable by uid 65534 \(mode 0600, owner 0:0\)/);
    assert.is((await readNamedFile(theirs, { reader })).toString(), 'x');
    assert.is((await readNamedFile(world, { reader })).toString(), 'x');
    // A link the client may follow, to a file it may not read: the target's mode counts.
    fs.symlinkSync(rootOnly, path.join(dir.path, 'link'));
    await rejects(readNamedFile(path.join(dir.path, 'link'), { reader }), /not readable by uid 65534/);
    fs.mkdirSync(path.join(dir.path, 'closed'), { mode: 0o700 });
    fs.writeFileSync(path.join(dir.path, 'closed', 'f'), 'x', { mode: 0o644 });
    await rejects(readNamedFile(path.join(dir.path, 'closed', 'f'), { reader }), /closed is not searchable by uid 65534/);
    await rejects(readNamedFile(theirs, { reader: { ...reader, anyone: true } }), /not readable/, 'a socket anyone may use: only world-readable files');
    // Who the SDS socket's clients are: its owner (or the agent itself when the socket is the agent's).
    const sock = put('sock', 0o660, 65534);
    assert.equal(socketReader(sock), { uid: 65534, gid: 65534, what: `uid 65534 gid 65534 (the owner of ${sock})` });
    fs.chownSync(sock, 0, 0);
    assert.equal(socketReader(sock), { self: true });
    fs.chmodSync(sock, 0o666);
    assert.ok((socketReader(sock) as { anyone?: boolean }).anyone);
  } finally {
    dir.cleanup();
  }
});

test.run();

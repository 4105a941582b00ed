// Issue 20 item 2: `pilot-agent discovery` on loopback served every `kind: Secret` private key of a namespace to
// any local uid that claimed to be a router of it. Against the real server (a child process, as root, its token
// files 0600), uid 65534 claims `router~...~x.test~...`: it gets the CA bundle and never the key, a guessed token is
// refused, and a real token of the namespace used under another namespace's node id is refused. The gateway that
// holds the token (the files' owner) gets the key.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { attack, discoveryListening, startDiscoveryProcess } from './helpers/discovery-process';
import { freePort, tempDir } from './helpers/harness';
import { makeCerts } from './helpers/test-certs';
import type { AdsAttack } from './helpers/discovery-attacker';

const SECRET_TYPE = 'type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret';
const NOBODY = 65534;
const b64 = (s: string) => Buffer.from(s).toString('base64');

test('uid 65534 claiming a router of the namespace gets no Secret private key; only the token holder does', async () => {
  const dir = tempDir('pa-sec-disc-keys-');
  const certs = await makeCerts(dir.path, { ca: {}, gw: { ca: 'ca', hosts: ['a.example.com'] } });
  const cfg = path.join(dir.path, 'mesh');
  fs.mkdirSync(path.join(cfg, 'ca', 'identities', 'test'), { recursive: true });
  fs.writeFileSync(path.join(cfg, 'ca', 'identities', 'test', 'ingress'), 'ingress-token\n', { mode: 0o600 });
  fs.writeFileSync(path.join(cfg, 'secret.yaml'), `apiVersion: v1
kind: Secret
metadata: {name: a-cred, namespace: test}
type: kubernetes.io/tls
data: {tls.crt: ${b64(certs.gw!.cert)}, tls.key: ${b64(certs.gw!.key)}, ca.crt: ${b64(certs.ca!.cert)}}
`);
  // The config directory is readable by nobody (as a shared mesh directory would be), the token files are not.
  fs.chmodSync(dir.path, 0o755);
  const address = `127.0.0.1:${await freePort()}`;
  const server = startDiscoveryProcess(cfg, address);
  const asRouter = (ns: string, token?: string): AdsAttack => ({
    mode: 'ads', address, nodeId: `router~10.0.0.9~x.${ns}~${ns}.svc.cluster.local`, ...(token && { token }),
    requests: [{ type_url: SECRET_TYPE, resource_names: ['kubernetes://a-cred', 'kubernetes://a-cred-cacert'] }], waitMs: 1500,
  });
  try {
    await discoveryListening(server);

    const anon = await attack(NOBODY, asRouter('test'));
    assert.is(anon.code, undefined, `the stream is served (anonymous): ${anon.details}`);
    assert.equal(anon.resources[SECRET_TYPE], ['kubernetes://a-cred-cacert'], 'the CA bundle only');
    assert.not.ok(anon.privateKey, 'uid 65534 got a private key');

    const guessed = await attack(NOBODY, asRouter('test', 'ingress'));
    assert.is(guessed.code, 16, `a guessed token is refused (UNAUTHENTICATED): ${JSON.stringify(guessed)}`);
    assert.not.ok(guessed.privateKey);

    const elsewhere = await attack(0, asRouter('other', 'ingress-token'));
    assert.is(elsewhere.code, 7, `a token of test under a node of namespace other is refused (PERMISSION_DENIED): ${JSON.stringify(elsewhere)}`);
    assert.not.ok(elsewhere.privateKey);

    const gateway = await attack(0, asRouter('test', 'ingress-token'));
    assert.is(gateway.code, undefined, gateway.details);
    assert.equal(gateway.resources[SECRET_TYPE]?.sort(), ['kubernetes://a-cred', 'kubernetes://a-cred-cacert']);
    assert.ok(gateway.privateKey, 'the authenticated gateway gets its key');

    assert.match(server.out(), /refused an xDS stream: the token matches no identity under ca\/identities/);
    assert.match(server.out(), /refused an xDS stream: the token is for test\/ingress; node id "router~10\.0\.0\.9~x\.other~other\.svc\.cluster\.local" claims namespace "other"/);
    assert.not.match(server.out(), /ingress-token|PRIVATE KEY/, 'no token and no key in the log');
  } finally {
    await server.stop();
    dir.cleanup();
  }
});

test.run();

// Issue 20 item 5: the embedded CA's token files were never permission-checked; written the obvious way (umask 022)
// they were 0644, and uid 65534 read another identity's token and got its certificate. Now `pilot-agent discovery`
// refuses to start on a token file readable by others or an identities directory others can write, naming it; with
// owner-only files uid 65534 can neither read a token nor get a certificate; and a file loosened while the server
// runs stops proving its identity.

import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { attack, discoveryListening, startDiscoveryProcess } from './helpers/discovery-process';
import { freePort, tempDir, waitFor } from './helpers/harness';

const NOBODY = 65534;
const ID = 'spiffe://cluster.local/ns/shop/sa/web';

function meshDir(root: string): { cfg: string; token: string } {
  const cfg = path.join(root, 'mesh');
  fs.mkdirSync(path.join(cfg, 'ca', 'identities', 'shop'), { recursive: true });
  const token = path.join(cfg, 'ca', 'identities', 'shop', 'web');
  return { cfg, token };
}

test('a token file readable by others, or an identities directory others can write, is a start-up error naming it', async () => {
  const dir = tempDir('pa-sec-disc-tokens-');
  const { cfg, token } = meshDir(dir.path);
  const old = process.umask(0o022);
  try {
    fs.writeFileSync(token, 'web-token\n'); // the obvious way: 0644
  } finally {
    process.umask(old);
  }
  fs.chmodSync(dir.path, 0o755);
  assert.is(fs.statSync(token).mode & 0o777, 0o644);
  // What the loose file gave away before: uid 65534 reads it.
  assert.is(execFileSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', 'cat', token], { encoding: 'utf8' }), 'web-token\n');
  const address = `127.0.0.1:${await freePort()}`;
  let server = startDiscoveryProcess(cfg, address);
  try {
    const code = await Promise.race([server.exited, new Promise<string>((r) => setTimeout(() => r('still running'), 15_000))]);
    assert.is(code, 1, `the server must not start with a 0644 token file:\n${server.out()}`);
    assert.match(server.out(), `${token} is readable or writable by group or others (mode 0644); want 0600`);
    assert.not.match(server.out(), /web-token/, 'the token itself is never in the log');

    fs.chmodSync(token, 0o600);
    fs.chmodSync(path.dirname(token), 0o777);
    server = startDiscoveryProcess(cfg, address);
    assert.is(await server.exited, 1);
    assert.match(server.out(), `${path.dirname(token)} is writable by group or others (mode 0777)`);
  } finally {
    await server.stop();
    dir.cleanup();
  }
});

test('with owner-only token files uid 65534 gets no certificate, and a file loosened while running proves nothing', async () => {
  const dir = tempDir('pa-sec-disc-tokens-');
  const { cfg, token } = meshDir(dir.path);
  fs.writeFileSync(token, 'web-token\n', { mode: 0o600 });
  fs.chmodSync(dir.path, 0o755);
  // The attacker's own guess, in a file it can read.
  const guess = path.join(dir.path, 'guess');
  fs.writeFileSync(guess, 'web-token-guess\n', { mode: 0o644 });
  const address = `127.0.0.1:${await freePort()}`;
  const server = startDiscoveryProcess(cfg, address);
  try {
    await discoveryListening(server);
    assert.throws(() => execFileSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', 'cat', token], { stdio: 'pipe' }));
    const stolen = await attack(NOBODY, { mode: 'ca', address, tokenFile: token, identity: ID });
    assert.is(stolen.signed, undefined);
    assert.match(stolen.details ?? '', /cannot read the CA token file.*EACCES/);
    const guessed = await attack(NOBODY, { mode: 'ca', address, tokenFile: guess, identity: ID });
    assert.is(guessed.signed, undefined);
    assert.match(guessed.details ?? '', /matches no identity/);
    // The owner's own request is signed.
    assert.is((await attack(0, { mode: 'ca', address, tokenFile: token, identity: ID })).signed, 2);

    // Loosened while the server runs: the identity is refused until the file is owner-only again.
    fs.chmodSync(token, 0o644);
    const loose = await attack(NOBODY, { mode: 'ca', address, tokenFile: token, identity: ID });
    assert.is(loose.signed, undefined, 'uid 65534 read a loosened token and got its certificate');
    assert.match(loose.details ?? '', /matches no identity/);
    await waitFor('the loosened file logged', () => server.out().includes(`${token} is readable or writable by group or others (mode 0644); want 0600; its identity is refused`));
    fs.chmodSync(token, 0o600);
    assert.is((await attack(0, { mode: 'ca', address, tokenFile: token, identity: ID })).signed, 2);
  } finally {
    await server.stop();
    dir.cleanup();
  }
});

test.run();

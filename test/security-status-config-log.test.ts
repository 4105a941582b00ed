// Issue 20 item 9: a file in the discovery config directory may be anything, a private key or /etc/shadow
// symlinked in, and the config errors go to a log other uids read. The real `pilot-agent discovery` and
// `pilot-agent proxy --meshConfig` are given such files: the log names each file, and quotes none of its text.

import { execFile, execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { agentBin } from './helpers/agent';
import { tempDir } from './helpers/harness';

function run(args: string[]): Promise<{ code: number; out: string }> {
  return new Promise((resolve) => {
    execFile(agentBin(), args, { timeout: 30_000, env: { PATH: process.env.PATH ?? '/usr/bin:/bin' } }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === 'number' ? err.code : 1) : 0, out: `${stdout}${stderr}` });
    });
  });
}

/** Every run of 16+ characters of a secret's text that is not a PEM armour line: none may reach the log. */
function secretPieces(text: string): string[] {
  return text.split('\n').filter((l) => !l.startsWith('-----')).flatMap((l) => l.match(/.{16}/g) ?? []);
}

test('keys and /etc/shadow symlinked into the config directory: the log names the files, never their contents', async () => {
  const dir = tempDir('pa-sec-cfglog-');
  try {
    const secrets = path.join(dir.path, 'secrets');
    const cfg = path.join(dir.path, 'config');
    fs.mkdirSync(secrets, { mode: 0o700 });
    fs.mkdirSync(cfg);
    const ec = path.join(secrets, 'ec.key');
    const rsa = path.join(secrets, 'rsa.key');
    execFileSync('openssl', ['genpkey', '-algorithm', 'EC', '-pkeyopt', 'ec_paramgen_curve:P-256', '-out', ec], { stdio: 'ignore' });
    execFileSync('openssl', ['genpkey', '-algorithm', 'RSA', '-pkeyopt', 'rsa_keygen_bits:2048', '-out', rsa], { stdio: 'ignore' });
    // A shadow file of our own (root-only, like the real one), with a line the parser reads as a mapping.
    const shadow = path.join(secrets, 'shadow');
    fs.writeFileSync(shadow, 'root:$6$Zq3pd9Ka$Vd0hmR7yQsecretHASHvalueXkT1bYcW9e/:20228:0:99999:7:::\nweb:$6$hash-of-web-5511ab:20228::::::\n', { mode: 0o600 });
    fs.symlinkSync(ec, path.join(cfg, 'ec-key.yaml'));
    fs.symlinkSync(rsa, path.join(cfg, 'rsa-key.yml'));
    fs.symlinkSync(shadow, path.join(cfg, 'shadow.yaml'));
    if (fs.existsSync('/etc/shadow')) fs.symlinkSync('/etc/shadow', path.join(cfg, 'etc-shadow.json'));
    // YAML the parser fails on, whose messages quote the offending text.
    fs.writeFileSync(path.join(cfg, 'alias.yaml'), 'token: *s3cr3t-alias-Value-42\n');
    fs.writeFileSync(path.join(cfg, 'header.yaml'), 'key: |s3cr3t-header-Value-42\n  x\n');

    const r = await run(['discovery', '--config-dir', cfg, '--grpc-addr', '127.0.0.1:0']);
    assert.is(r.code, 1, r.out);
    for (const f of ['ec-key.yaml', 'rsa-key.yml', 'shadow.yaml', 'alias.yaml', 'header.yaml']) assert.ok(r.out.includes(f), `the log names ${f}:\n${r.out}`);
    assert.not.match(r.out, /PRIVATE KEY|BEGIN/);
    assert.not.match(r.out, /s3cr3t|\$6\$|secretHASH|hash-of-web/);
    for (const p of [...secretPieces(fs.readFileSync(ec, 'utf8')), ...secretPieces(fs.readFileSync(rsa, 'utf8'))]) {
      assert.not.ok(r.out.includes(p), `key material in the log: ${p}`);
    }
    if (fs.existsSync('/etc/shadow')) {
      assert.ok(r.out.includes('etc-shadow.json'));
      for (const l of fs.readFileSync('/etc/shadow', 'utf8').split('\n').filter((x) => x.includes(':'))) {
        assert.not.ok(r.out.includes(l.split(':').slice(0, 2).join(':')), 'a line of /etc/shadow is in the log');
      }
    }

    // The same files as the agent's mesh config: one error naming the file, no text of it.
    for (const f of ['alias.yaml', 'header.yaml', 'ec-key.yaml', 'shadow.yaml']) {
      const m = await run(['proxy', 'sidecar', '--meshConfig', path.join(cfg, f)]);
      assert.ok(m.code !== 0);
      assert.not.match(m.out, /s3cr3t|PRIVATE KEY|BEGIN|\$6\$|secretHASH/, m.out);
    }
  } finally {
    dir.cleanup();
  }
});

test.run();

// Envoy's hot-restart channel is reachable by Envoy's own user only. Envoy's default puts its sockets in the
// abstract namespace, which has no permissions: any uid in the network namespace (the app of a pod, every user
// of a VM) could send the serving Envoy a Terminate, or ask it for its listen sockets. The agent gives Envoy a
// socket path in configPath, in a 0700 directory of Envoy's user, with sockets of mode 0600.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { debugEpochs, waitLiveEpoch } from './helpers/agent';
import { agentFixture } from './helpers/agent-fixture';
import { freePort, pidAlive, sleep, waitFor } from './helpers/harness';
import { staticBootstrap } from './helpers/static-bootstrap';

// One hot-restart Request{terminate} (HotRestartMessage field 1, Request field 5), 8-byte big-endian length first.
// Abstract names are the whole 108-byte sun_path, NUL-padded, as Envoy binds them.
const ATTACK = `
import socket, struct, sys
msg = bytes([0x0a, 0x02, 0x2a, 0x00])
for name in sys.argv[1:]:
    a = (b"\\0" + name[1:].encode()).ljust(108, b"\\0") if name.startswith("@") else name.encode()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.sendto(struct.pack(">Q", len(msg)) + msg, a)
        print(name, "sent")
    except OSError as e:
        print(name, type(e).__name__)
`;

function asNobody(args: string[]): Promise<string> {
  return new Promise((resolve) => {
    execFile('setpriv', ['--reuid', '65534', '--regid', '65534', '--clear-groups', '/usr/bin/python3', '-c', ATTACK, ...args],
      { timeout: 10_000 }, (_err, stdout, stderr) => resolve(String(stdout) + String(stderr)));
  });
}

/**
 * The number Envoy 1.40 puts in a hot-restart socket's name for `base id x 10 + epoch % 3`: computed in 32 bits and
 * sign-extended, so a dynamic base id above 214748364 (Envoy draws up to 2^28 - 1) gives a 20-digit number.
 */
function envoySocketId(n: number): string {
  return n >= 2 ** 31 ? (BigInt(n) - 2n ** 32n + 2n ** 64n).toString() : String(n);
}

test('another uid cannot terminate Envoy over its hot-restart sockets; hot restart still works; the sockets go with the agent', async () => {
  const agent = await agentFixture({ prefix: 'pa-hrsock-', mode: 0o755 }); // the attacker may walk up to configPath
  const { dir } = agent;
  const ports = { admin: agent.ports.admin, status: agent.ports.status, listen: await freePort() };
  const custom = path.join(dir.path, 'custom.json');
  fs.writeFileSync(custom, JSON.stringify(staticBootstrap(ports, 'hr')));
  const configPath = path.join(dir.path, 'proxy');
  try {
    await agent.start({ proxyConfig: { configPath, customConfigFile: custom }, env: { POD_NAME: 'hr' }, ready: 'live' });
    const d = await debugEpochs(ports.status);
    const scaled = d.baseId! * 10;
    const id = (n: number) => envoySocketId(n);
    const envoy0 = d.epochs[0]!.pid;
    const socketDir = path.join(configPath, 'envoy-hot-restart');
    const parent = path.join(socketDir, `s_parent_${id(scaled)}`);
    const out = await asNobody([`@envoy_domain_socket_parent_${id(scaled)}`, parent]);
    assert.not.match(out, /sent/, `nothing reached Envoy: ${out}`);
    assert.match(out, /PermissionError/, `the socket in configPath refuses another uid: ${out}`);
    await sleep(1500);
    assert.ok(pidAlive(envoy0), 'Envoy is still serving');
    assert.is((await debugEpochs(ports.status)).epochs.find((e) => e.pid === envoy0)?.state, 'live');

    const st = fs.statSync(socketDir);
    assert.is(st.mode & 0o777, 0o700, 'the socket directory is its owner\'s only');
    assert.ok(fs.readdirSync(socketDir).includes(path.basename(parent)), `Envoy binds its parent socket in configPath: ${fs.readdirSync(socketDir)}`);
    assert.is(fs.lstatSync(parent).mode & 0o777, 0o600);
    assert.not.ok(fs.readFileSync('/proc/net/unix', 'utf8').includes(`@envoy_domain_socket_parent_${id(scaled)}`), 'no abstract socket');

    agent.proc.kill('SIGHUP');
    const e1 = await waitLiveEpoch(ports.status, 1, 30_000).catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
    assert.is.not(e1.pid, envoy0, 'a hot restart over the socket in configPath');
    assert.ok(fs.lstatSync(path.join(socketDir, `s_parent_${id(scaled + 1)}`)).isSocket());

    agent.proc.kill('SIGTERM');
    assert.is((await waitFor('agent exit', () => agent.exited, 30_000)).code, 0);
    assert.not.ok(fs.existsSync(socketDir), 'the hot-restart sockets are removed with the agent');
  } finally {
    await agent.close();
  }
});

test.run();

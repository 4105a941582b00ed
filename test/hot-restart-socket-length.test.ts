// The hot-restart socket path the agent gives Envoy must fit sun_path with the longest name Envoy derives from it:
// Envoy 1.40 computes `base id x 10 + epoch` in 32 bits and sign-extends it, so a dynamic base id above 214748364
// names its sockets with 20 digits. The real Envoy, with the largest base id it can draw, on the longest path.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { AgentConfig } from '../lib/config';
import { hotRestartSocket } from '../lib/envoy-runtime';
import { envoyBin, tempDir, waitFor } from './helpers/harness';

const MAX_DYNAMIC_BASE_ID = 2 ** 28 - 1;

test('the longest configPath that gets a hot-restart socket fits Envoy\'s 20-digit names (largest dynamic base id)', async () => {
  const dir = tempDir('pa-hrlen-');
  const shm = `/dev/shm/envoy_shared_memory_${MAX_DYNAMIC_BASE_ID * 10}`;
  try {
    // Grow configPath one byte at a time until the agent would fall back to Envoy's abstract default.
    let configPath = path.join(dir.path, 'p');
    const cfgOf = (p: string) => ({ proxy: { configPath: p } }) as unknown as AgentConfig;
    while (hotRestartSocket(cfgOf(configPath + 'x'))) configPath += 'x';
    const socket = hotRestartSocket(cfgOf(configPath))!;
    assert.ok(socket, 'a socket path at the limit');
    fs.mkdirSync(path.dirname(socket), { recursive: true, mode: 0o700 });
    const bootstrap = path.join(dir.path, 'b.json');
    fs.writeFileSync(bootstrap, JSON.stringify({
      admin: { address: { socket_address: { address: '127.0.0.1', port_value: 0 } } },
    }));
    const envoy = spawn(envoyBin(), ['-c', bootstrap, '--base-id', String(MAX_DYNAMIC_BASE_ID), '--socket-path',
      socket, '--socket-mode', '600', '-l', 'error'], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    envoy.stderr!.on('data', (c: Buffer) => (err += c.toString()));
    const exited = new Promise<number | null>((r) => envoy.once('exit', (code) => r(code)));
    try {
      const names = await waitFor('Envoy bound its parent socket', () => {
        if (envoy.exitCode !== null) throw new Error(`Envoy exited ${envoy.exitCode}: ${err}`);
        const ls = fs.readdirSync(path.dirname(socket));
        return ls.some((n) => n.startsWith('s_udp_parent_')) ? ls : undefined;
      }, 15_000);
      const longest = names.reduce((a, n) => (n.length > a.length ? n : a), '');
      assert.match(longest, /^s_udp_parent_\d{20}$/, `Envoy's 20-digit name: ${names.join(' ')}`);
      assert.ok(Buffer.byteLength(path.join(path.dirname(socket), longest)) <= 107);
    } finally {
      envoy.kill('SIGKILL');
      await exited;
    }
  } finally {
    fs.rmSync(shm, { force: true });
    dir.cleanup();
  }
});

test.run();

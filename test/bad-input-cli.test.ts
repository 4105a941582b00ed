// The real executable with input that parses but cannot run, or that is built to hurt: each gives one line naming
// the field and where its value came from, a non-zero exit within seconds, and leaves nothing behind.

import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { execFile } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { agentBin } from './helpers/agent';
import { envoyBin, freePort, tempDir } from './helpers/harness';

function run(args: string[], env: Record<string, string>, cwd: string): Promise<{ code: number | string; stdout: string; stderr: string; ms: number }> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    // A hang is a failure: killed after 20 s, it shows as code SIGKILL.
    execFile(agentBin(), args, { cwd, env, timeout: 20_000, killSignal: 'SIGKILL', maxBuffer: 64 * 1024 * 1024 }, (err, stdout, stderr) => {
      const e = err as (Error & { code?: number; signal?: string }) | null;
      resolve({ code: e ? (e.signal ?? e.code ?? 1) : 0, stdout, stderr, ms: Date.now() - t0 });
    });
  });
}

interface Case {
  name: string;
  /** Merged over a config that would run (free ports, the real Envoy, configPath in the temp dir). */
  proxyConfig?: Record<string, unknown> | string;
  env?: Record<string, string>;
  args?: string[];
  want: RegExp;
}

const CASES: Case[] = [
  { name: 'item 16: configPath under /proc', proxyConfig: { configPath: '/proc/foo' }, want: /^error: invalid configPath \(from environment variable PROXY_CONFIG\): \/proc\/foo is not a writable directory: .*ENOENT/ },
  { name: 'item 11: a duration no timer can hold', proxyConfig: { terminationDrainDuration: '1000h' }, want: /^error: invalid terminationDrainDuration \(from environment variable PROXY_CONFIG\): "1000h" is longer than the longest supported duration, 596h31m23\.647s$/ },
  { name: 'item 11: a duration env var no timer can hold', env: { MAXIMUM_DRAIN_DURATION: '1000h' }, want: /^error: invalid MAXIMUM_DRAIN_DURATION \(from environment variable MAXIMUM_DRAIN_DURATION\)/ },
  { name: 'item 12: drainDuration .inf', proxyConfig: 'DRAIN_INF', want: /^error: invalid drainDuration \(from environment variable PROXY_CONFIG\): Infinity seconds is not a finite duration$/ },
  { name: 'item 8: concurrency 1e30', proxyConfig: { concurrency: 1e30 }, want: /^error: invalid concurrency \(from environment variable PROXY_CONFIG\)/ },
  { name: 'item 8: --concurrency -1', args: ['--concurrency', '-1'], want: /^error: invalid concurrency \(from --concurrency\)/ },
  { name: 'item 8: proxyAdminPort 15090', proxyConfig: { proxyAdminPort: 15090 }, env: { ENVOY_PROMETHEUS_PORT: '' }, want: /^error: invalid proxyAdminPort \(from environment variable PROXY_CONFIG\): port \d+ is also ENVOY_PROMETHEUS_PORT/ },
  { name: 'item 8: ENVOY_STATUS_PORT equal to the status port', env: { ENVOY_STATUS_PORT: 'STATUS' }, want: /^error: invalid ENVOY_STATUS_PORT \(from environment variable ENVOY_STATUS_PORT\): port \d+ is also statusPort/ },
  { name: 'item 8: ENVOY_PROMETHEUS_PORT out of range', env: { ENVOY_PROMETHEUS_PORT: '70000' }, want: /^error: invalid ENVOY_PROMETHEUS_PORT .*out of range 1-65535/ },
  { name: 'item 10: discoveryAddress garbage', proxyConfig: { discoveryAddress: 'garbage' }, want: /^error: invalid discoveryAddress \(from environment variable PROXY_CONFIG\): "garbage" is not an address/ },
  { name: 'item 10: discoveryAddress host:99999', proxyConfig: { discoveryAddress: 'host:99999' }, want: /^error: invalid discoveryAddress .*port "99999" is out of range/ },
  { name: 'item 10: discoveryAddress with a scheme', proxyConfig: { discoveryAddress: 'http://istiod:15012' }, want: /^error: invalid discoveryAddress .*has a URL scheme/ },
  // Read by components that load after Envoy's spawn, but checked before it (issue 16 moved the spawn earlier).
  { name: 'app probers that are not JSON', env: { ISTIO_KUBE_APP_PROBERS: '{bad' }, want: /^error: invalid ISTIO_KUBE_APP_PROBERS \(from environment variable ISTIO_KUBE_APP_PROBERS\): not JSON/ },
  { name: 'app metrics annotations that are not JSON', env: { ISTIO_PROMETHEUS_ANNOTATIONS: '{x' }, want: /^error: invalid ISTIO_PROMETHEUS_ANNOTATIONS .*not JSON/ },
  { name: 'an unknown key algorithm', env: { ECC_SIGNATURE_ALGORITHM: 'RSA2' }, want: /^error: invalid ECC_SIGNATURE_ALGORITHM "RSA2" \(want ECDSA or unset\)$/ },
  { name: 'a readiness probe on port 0', proxyConfig: { readinessProbe: { httpGet: { port: 0 } } }, want: /^error: invalid readinessProbe\.httpGet\.port \(from environment variable PROXY_CONFIG\): 0 is not a port number$/ },
  // 100 KB: Linux limits one environment string to 128 KiB.
  { name: 'a 100 KB value is quoted short', proxyConfig: { discoveryAddress: 'x'.repeat(100_000) }, want: /^error: invalid discoveryAddress .*"x{200}"\.\.\. \(100000 characters\) is not an address/ },
];

const bad = suite('bad input, real executable');

for (const c of CASES) {
  bad(`${c.name}: one short error line, non-zero exit, nothing started`, async () => {
    const dir = tempDir();
    try {
      const configPath = path.join(dir.path, 'proxy');
      const [statusPort, proxyAdminPort, envoyStatus, envoyProm] = [await freePort(), await freePort(), await freePort(), await freePort()];
      const base = { configPath, binaryPath: envoyBin(), statusPort, proxyAdminPort, discoveryAddress: '127.0.0.1:1' };
      const pcText =
        c.proxyConfig === 'DRAIN_INF'
          ? `configPath: ${configPath}\nbinaryPath: ${envoyBin()}\nstatusPort: ${statusPort}\nproxyAdminPort: ${proxyAdminPort}\ndrainDuration: .inf\n`
          : JSON.stringify({ ...base, ...(c.proxyConfig as Record<string, unknown>) });
      const env: Record<string, string> = { PROXY_CONFIG: pcText, POD_NAME: 'p', POD_NAMESPACE: 'ns', ENVOY_STATUS_PORT: String(envoyStatus), ENVOY_PROMETHEUS_PORT: String(envoyProm) };
      for (const [k, v] of Object.entries(c.env ?? {})) {
        if (v === '') delete env[k]; // back to its default
        else env[k] = v === 'STATUS' ? String(statusPort) : v;
      }
      const r = await run(['proxy', ...(c.args ?? [])], env, dir.path);
      assert.is.not(r.code, 0);
      assert.is.not(r.code, 'SIGKILL', `hung for 20 s:\n${r.stderr.slice(0, 500)}`);
      const lines = r.stderr.trim().split('\n');
      assert.is(lines.length, 1, `one error line, got:\n${r.stderr.slice(0, 2000)}`);
      assert.ok(lines[0]!.length < 600, `a short line, got ${lines[0]!.length} characters`);
      assert.match(lines[0]!, c.want);
      const left = fs.existsSync(configPath) ? fs.readdirSync(configPath) : [];
      assert.equal(left, [], 'nothing written');
    } finally {
      dir.cleanup();
    }
  });
}

bad.run();

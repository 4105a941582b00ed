import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { buildConfig, type Flags } from '../lib/config';
import { bootstrapFileName, envoyArgs, type EnvoyArgsInputs } from '../lib/envoy-args';

function cfgOf(opts: { flags?: Flags; env?: Record<string, string> } = {}) {
  return buildConfig({ flags: opts.flags ?? {}, env: opts.env ?? {}, readFile: () => undefined });
}

function args(over: Partial<EnvoyArgsInputs> & { flags?: Flags; env?: Record<string, string> } = {}): string[] {
  const { flags, env, ...rest } = over;
  return envoyArgs({ cfg: cfgOf({ flags, env }), configFile: '/etc/istio/proxy/envoy-rev0.json', epoch: 0, baseId: { id: 7 }, ipv6: false, ...rest });
}

/** The value after a flag, or undefined when the flag is absent. */
function flag(a: string[], name: string): string | undefined {
  const i = a.indexOf(name);
  return i < 0 ? undefined : a[i + 1];
}

test('bootstrapFileName is envoy-rev<epoch>.json', () => {
  assert.is(bootstrapFileName(0), 'envoy-rev0.json');
  assert.is(bootstrapFileName(12), 'envoy-rev12.json');
});

test('defaults: config file, epoch, drain, shutdown, strategy, ip version, flush, unknown static fields, log level', () => {
  const a = args();
  assert.equal(a.slice(0, 4), ['-c', '/etc/istio/proxy/envoy-rev0.json', '--restart-epoch', '0']);
  assert.is(flag(a, '--drain-time-s'), '45');
  assert.is(flag(a, '--parent-shutdown-time-s'), '60');
  assert.is(flag(a, '--drain-strategy'), 'immediate');
  assert.is(flag(a, '--local-address-ip-version'), 'v4');
  assert.is(flag(a, '--file-flush-interval-msec'), '1000');
  assert.ok(a.includes('--allow-unknown-static-fields'));
  assert.is(flag(a, '-l'), 'warning');
  for (const absent of ['--component-log-level', '--concurrency', '--enable-core-dump', '--file-flush-min-size-kb', '--use-dynamic-base-id']) {
    assert.not.ok(a.includes(absent), absent);
  }
});

test('durations from ProxyConfig, in whole seconds rounded up', () => {
  const a = args({ env: { PROXY_CONFIG: '{"drainDuration": "10s", "parentShutdownDuration": "1m30s", "fileFlushInterval": "250ms"}' } });
  assert.is(flag(a, '--drain-time-s'), '10');
  assert.is(flag(a, '--parent-shutdown-time-s'), '90');
  assert.is(flag(a, '--file-flush-interval-msec'), '250');
  assert.is(flag(args({ env: { PROXY_CONFIG: '{"drainDuration": "1500ms"}' } }), '--drain-time-s'), '2');
});

test('IPv6 pods use --local-address-ip-version v6', () => {
  assert.is(flag(args({ ipv6: true }), '--local-address-ip-version'), 'v6');
});

test('log levels: -l and --component-log-level', () => {
  const a = args({ flags: { proxyLogLevel: 'info,misc:error', proxyComponentLogLevel: 'upstream:debug' } });
  assert.is(flag(a, '-l'), 'info');
  assert.is(flag(a, '--component-log-level'), 'misc:error,upstream:debug');
});

test('--concurrency only when greater than zero', () => {
  assert.is(flag(args({ flags: { concurrency: 2 } }), '--concurrency'), '2');
  assert.is(flag(args({ env: { ISTIO_CPU_LIMIT: '3' } }), '--concurrency'), '3');
  assert.not.ok(args({ flags: { concurrency: 0 } }).includes('--concurrency'));
});

test('--enable-core-dump when asked', () => {
  assert.ok(args({ coreDump: true }).includes('--enable-core-dump'));
  assert.not.ok(args({ coreDump: false }).includes('--enable-core-dump'));
});

test('--file-flush-min-size-kb when set', () => {
  assert.is(flag(args({ env: { PROXY_CONFIG: '{"fileFlushMinSize": 64}' } }), '--file-flush-min-size-kb'), '64');
});

test('dynamic base id only at epoch 0; later epochs take the fixed id', () => {
  const first = args({ baseId: { dynamic: true, path: '/tmp/pa/base-id' } });
  assert.ok(first.includes('--use-dynamic-base-id'));
  assert.is(flag(first, '--base-id-path'), '/tmp/pa/base-id');
  assert.not.ok(first.includes('--base-id'));
  const later = args({ epoch: 3, baseId: { id: 42 }, configFile: '/x/envoy-rev3.json' });
  assert.is(flag(later, '--restart-epoch'), '3');
  assert.is(flag(later, '--base-id'), '42');
  assert.is(flag(later, '-c'), '/x/envoy-rev3.json');
  assert.not.ok(later.includes('--use-dynamic-base-id') || later.includes('--base-id-path'));
  assert.throws(() => args({ epoch: 1, baseId: { dynamic: true, path: '/tmp/pa/base-id' } }), /epoch 1 needs the base id that epoch 0 wrote/);
});

test('a fixed base id is used at every epoch, including 0', () => {
  assert.is(flag(args({ baseId: { id: 5 } }), '--base-id'), '5');
  assert.is(flag(args({ baseId: { dynamic: false, id: 5 }, epoch: 2 }), '--base-id'), '5');
});

test('never --disable-hot-restart', () => {
  const variants = [
    args(),
    args({ epoch: 4, baseId: { id: 1 }, ipv6: true, coreDump: true, flags: { concurrency: 4, proxyLogLevel: 'debug' } }),
    args({ baseId: { dynamic: true, path: '/p' }, env: { PROXY_CONFIG: '{"fileFlushMinSize": 8}' } }),
  ];
  for (const a of variants) assert.not.ok(a.includes('--disable-hot-restart'), a.join(' '));
});

test('bad epoch or base id is refused', () => {
  assert.throws(() => args({ epoch: -1 }), /invalid restart epoch/);
  assert.throws(() => args({ baseId: { id: 1.5 } }), /invalid Envoy base id/);
});

test('every argument is a string with no empty flag values', () => {
  const a = args({ flags: { concurrency: 2, proxyLogLevel: 'info,misc:error' }, coreDump: true });
  assert.ok(a.every((x) => typeof x === 'string' && x.length > 0));
});

test.run();

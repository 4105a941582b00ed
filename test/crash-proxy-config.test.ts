// A ProxyConfig that istiod accepts never stops the agent (issue 23): fields this agent does not know are warned
// about once and passed on, snake_case names are taken as protojson takes them, Istio's own names are mapped, and a
// known field with a wrong value is still an error naming it.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { buildConfig } from '../lib/config';
import { configureLogging, resetLogging } from '../lib/log';
import { parseProxyConfigLayer, proxyConfigJson } from '../lib/proxy-config';
import { waitLiveEpoch } from './helpers/agent';
import { agentFixture } from './helpers/agent-fixture';
import { freePort } from './helpers/harness';
import { staticBootstrap } from './helpers/static-bootstrap';

const ENV = 'environment variable PROXY_CONFIG';

function withLogs<T>(fn: () => T): { value: T; logs: string[] } {
  const logs: string[] = [];
  configureLogging({ write: (l) => void logs.push(l) });
  try {
    return { value: fn(), logs };
  } finally {
    resetLogging();
  }
}

const cfg = (proxyConfig: string) => buildConfig({ flags: {}, env: { PROXY_CONFIG: proxyConfig }, readFile: () => undefined });

test('what istiod puts in PROXY_CONFIG starts: Istio\'s fileFlushMinSizeKb, a field newer than this agent, snake_case names', () => {
  const { value: c, logs } = withLogs(() => cfg(JSON.stringify({
    fileFlushMinSizeKb: 64, connectionSettings: {}, proxy_metadata: { ISTIO_META_DNS_CAPTURE: 'true' }, drain_duration: '7s',
    proxyStatsMatcher: { inclusion_prefixes: ['cluster.'], inclusionSomethingNew: ['x'] },
  })));
  assert.is(c.proxy.fileFlushMinSize, 64);
  assert.equal({ ...c.proxy.proxyMetadata }, { ISTIO_META_DNS_CAPTURE: 'true' });
  assert.is(c.proxy.drainDuration, 7000);
  assert.equal({ ...c.proxy.proxyStatsMatcher }, { inclusionPrefixes: ['cluster.'] });
  assert.equal({ ...c.proxy.extra }, { connectionSettings: {} }, 'passed on to istiod in the node metadata');
  const warns = logs.filter((l) => /\twarn\t/.test(l));
  assert.equal(warns.map((l) => l.replace(/^.*\twarn\tconfig\t/, '')), [
    `ignoring ProxyConfig field connectionSettings from ${ENV}: not known to this agent`,
    `ignoring ProxyConfig field proxyStatsMatcher.inclusionSomethingNew from ${ENV}: not known to this agent`,
  ]);
  // Istio's name in the node metadata's PROXY_CONFIG too.
  assert.is(proxyConfigJson(c.proxy, c.sources).fileFlushMinSizeKb, 64);
  assert.is(proxyConfigJson(c.proxy, c.sources).fileFlushMinSize, undefined);
});

test('the mesh config\'s defaultConfig is read the same way (istiod\'s mesh-wide settings)', () => {
  const mesh = 'defaultConfig:\n  fileFlushMinSizeKb: 32\n  connectionSettings: {}\n  proxy_metadata: {A: b}\n';
  const { value: c } = withLogs(() => buildConfig({ flags: {}, env: {}, readFile: (f) => (f === './etc/istio/config/mesh' ? mesh : undefined) }));
  assert.is(c.proxy.fileFlushMinSize, 32);
  assert.equal({ ...c.proxy.proxyMetadata }, { A: 'b' });
  assert.equal(Object.keys(c.proxy.extra), ['connectionSettings']);
});

test('an unknown field is warned about once, however many layers and reloads name it', () => {
  const { logs } = withLogs(() => {
    for (let i = 0; i < 3; i++) parseProxyConfigLayer({ brandNewKnob: i }, ENV);
    parseProxyConfigLayer({ brandNewKnob: 1 }, 'mesh config defaultConfig');
  });
  assert.is(logs.filter((l) => /brandNewKnob/.test(l)).length, 1);
});

test('wrong values of known fields are still errors naming the field as given, also beside unknown fields', () => {
  const rejects = (json: string, re: RegExp) => {
    try {
      withLogs(() => cfg(json));
    } catch (e) {
      assert.match((e as Error).message, re);
      return;
    }
    assert.unreachable(`accepted ${json}`);
  };
  rejects('{"connectionSettings": {}, "statusPort": 0}', /statusPort \(from environment variable PROXY_CONFIG\).*out of range/);
  rejects('{"drain_duration": "forever"}', /drain_duration \(drainDuration\) \(from environment variable PROXY_CONFIG\)/);
  rejects('{"fileFlushMinSizeKb": -1}', /fileFlushMinSizeKb \(fileFlushMinSize\).*non-negative integer/);
  rejects('{"proxy_metadata": "x"}', /proxy_metadata \(proxyMetadata\).*map of strings/);
  rejects('{"proxyMetadata": {}, "proxy_metadata": {}}', /proxy_metadata .*the same field as "proxyMetadata"/);
  rejects('{"proxyStatsMatcher": {"inclusion_prefixes": "cluster."}}', /proxyStatsMatcher .*list of strings/);
});

test('names that cannot be a proto field (__proto__, constructor, junk) are warned about and dropped, never kept', () => {
  const { value: c } = withLogs(() => cfg('{"__proto__": {"statusPort": 1}, "constructor": 1, "a b": 2, "statusPort": 15030}'));
  assert.is(c.proxy.statusPort, 15030);
  assert.equal(Object.keys(c.proxy.extra), []);
  assert.is(({} as Record<string, unknown>).statusPort, undefined, 'Object.prototype untouched');
});

test('the real agent starts with PROXY_CONFIG {fileFlushMinSizeKb, connectionSettings, proxy_metadata} and gives Envoy --file-flush-min-size-kb', async () => {
  const agent = await agentFixture({ prefix: 'pa-pc-' });
  const ports = { ...agent.ports, listen: await freePort() };
  const custom = path.join(agent.dir.path, 'custom.json');
  fs.writeFileSync(custom, JSON.stringify(staticBootstrap(ports, 'ok')));
  try {
    await agent.start({
      proxyConfig: {
        customConfigFile: custom, parentShutdownDuration: undefined,
        fileFlushMinSizeKb: 64, connectionSettings: {}, proxy_metadata: { FOO: 'bar' },
      },
      env: { POD_NAME: 'pc' },
      ready: 'none',
    });
    const live = await waitLiveEpoch(ports.status, 0, 30_000).catch((e: Error) => { throw new Error(`${e.message}\n${agent.log()}`); });
    const argv = fs.readFileSync(`/proc/${live.pid}/cmdline`, 'utf8').split('\0');
    assert.is(argv[argv.indexOf('--file-flush-min-size-kb') + 1], '64');
    assert.is(agent.log().match(/ignoring ProxyConfig field connectionSettings/g)?.length, 1, agent.log());
  } finally {
    await agent.close();
  }
});

test.run();

// `proxy` command lines in the common forms are parsed without yargs (agent.ts fastProxyArgv, a start-up cost
// before Envoy's spawn); each result must be what yargs gives for the same line, and every other form must be left
// to yargs (undefined), so help, errors and yargs' own conventions stay as they were.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import yargs from 'yargs';
import { fastProxyArgv } from '../agent';

const VALUE = ['log_output_level', 'log_target', 'log_caller', 'log_stacktrace_level', 'domain', 'meshConfig',
  'serviceCluster', 'proxyLogLevel', 'proxyComponentLogLevel', 'templateFile', 'outlierLogPath', 'standalone'];

/** What the agent's yargs definition of `proxy` yields, reduced to the keys the agent reads. */
async function viaYargs(args: string[]): Promise<Record<string, unknown>> {
  let got: Record<string, unknown> = {};
  const config = { 'unknown-options-as-args': false, 'camel-case-expansion': false };
  let y = yargs(args).parserConfiguration(config).strict(false);
  y = y.command('proxy [type]', '', (c) => {
    let o = c.positional('type', { type: 'string', default: 'sidecar' })
      .option('log_as_json', { type: 'boolean', default: false })
      .option('profiling', { type: 'boolean', default: true })
      .option('concurrency', { type: 'number', requiresArg: true });
    for (const v of VALUE) o = o.option(v, { type: 'string', requiresArg: true });
    return o;
  }, (argv) => {
    got = argv as Record<string, unknown>;
  });
  await y.parseAsync();
  const last = (v: unknown) => (Array.isArray(v) ? v[v.length - 1] : v);
  const out: Record<string, unknown> = { type: got.type, log_as_json: got.log_as_json, profiling: got.profiling };
  for (const k of [...VALUE, 'concurrency']) {
    if (got[k] !== undefined) out[k] = k === 'log_target' ? ([] as unknown[]).concat(got[k]) : last(got[k]);
  }
  return out;
}

const same = [
  ['proxy'],
  ['proxy', 'sidecar'],
  ['proxy', 'router', '--domain', 'ns.svc.cluster.local', '--proxyLogLevel=warning',
    '--proxyComponentLogLevel=misc:error'],
  ['proxy', 'sidecar', '--log_output_level=default:info', '--concurrency', '2', '--log_as_json'],
  ['proxy', '--log_target', 'stdout', '--log_target=/tmp/x.log', 'sidecar', '--profiling=false'],
  ['proxy', 'sidecar', '--domain', 'a', '--domain=b', '--log_as_json=false', '--meshConfig', './etc/istio/config/mesh'],
  ['proxy', 'sidecar', '--standalone', '/etc/mesh', '--templateFile=/t.json', '--outlierLogPath', '/dev/stdout'],
];

test('the common forms parse as yargs parses them', async () => {
  for (const args of same) {
    const fast = fastProxyArgv(args);
    assert.ok(fast, `${args.join(' ')} takes the fast path`);
    assert.equal(fast, await viaYargs(args), args.join(' '));
  }
});

test('every other form is left to yargs', () => {
  const others = [
    ['proxy', '--help'], ['proxy', '-h'], ['proxy', 'sidecar', 'extra'], ['proxy', '--unknown=1'],
    ['proxy', '--domain'], ['proxy', '--domain', '--log_as_json'], ['proxy', '--domain='],
    ['proxy', '--concurrency', 'two'], ['proxy', '--log_as_json', 'true'], ['proxy', '--profiling'],
    ['proxy', '--no-profiling'], ['proxy', '--log_as_json=yes'], ['proxy', '--', 'x'], ['bootstrap'], ['version'],
  ];
  for (const args of others) assert.is(fastProxyArgv(args), undefined, args.join(' '));
});

test.run();

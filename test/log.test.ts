import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { configureLogging, parseOutputLevels, resetLogging, scope, timestamp } from '../lib/log';

function capture(): string[] {
  const lines: string[] = [];
  configureLogging({ write: (l) => lines.push(l) });
  return lines;
}

test.after.each(() => resetLogging());

test('text lines use Istio\'s format: RFC3339 micros, level, scope, message', () => {
  const lines = capture();
  scope('xdsproxy').info('connected', { upstream: 'istiod:15012' });
  assert.is(lines.length, 1);
  assert.match(lines[0]!, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z\tinfo\txdsproxy\tconnected\tupstream=istiod:15012$/);
  assert.is(timestamp(new Date('2026-01-02T03:04:05.678Z')), '2026-01-02T03:04:05.678000Z');
});

test('--log_as_json writes one JSON object a line', () => {
  const lines = capture();
  configureLogging({ json: true });
  scope('agent').warn('careful', { epoch: 3 });
  const j = JSON.parse(lines[0]!);
  assert.is(j.level, 'warn');
  assert.is(j.scope, 'agent');
  assert.is(j.msg, 'careful');
  assert.is(j.epoch, 3);
});

test('--log_output_level sets the default and per-scope levels', () => {
  const lines = capture();
  configureLogging({ outputLevel: 'warn,xdsproxy:debug' });
  scope('agent').info('hidden');
  scope('agent').warn('shown');
  scope('xdsproxy').debug('shown too');
  assert.equal(lines.map((l) => l.split('\t')[3]), ['shown', 'shown too']);
  assert.equal(parseOutputLevels('default:error,dns:none').defaultLevel, 'error');
  assert.throws(() => parseOutputLevels('agent:loud'), /unknown log level/);
});

test.run();

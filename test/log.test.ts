import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { configureLogging, journalLine, journalPrefix, parseOutputLevels, resetLogging, scope, stderrIsJournal, timestamp } from '../lib/log';

function capture(): string[] {
  const lines: string[] = [];
  configureLogging({ write: (l) => lines.push(l), journal: false });
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

test('a line\'s timestamp has real microseconds, in order, on the wall clock', () => {
  const stamps: string[] = [];
  for (let i = 0; i < 200; i++) stamps.push(timestamp());
  const micros = (t: string) => Date.parse(t) * 1000 + Number(t.slice(23, 26));
  for (let i = 1; i < stamps.length; i++) assert.ok(micros(stamps[i]!) >= micros(stamps[i - 1]!), `${stamps[i - 1]} then ${stamps[i]}`);
  assert.ok(stamps.some((t) => !t.endsWith('000Z')), 'some stamp has a sub-millisecond part');
  assert.ok(new Set(stamps.map((t) => t.slice(0, 23))).size < new Set(stamps).size, 'lines within one ms differ');
  assert.ok(Math.abs(Date.parse(stamps[0]!) - Date.now()) < 1000, `${stamps[0]} is now`);
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

test('under the journal a line starts with its syslog priority and has no timestamp of its own', () => {
  const lines = capture();
  configureLogging({ journal: true, outputLevel: 'debug' });
  const log = scope('agent');
  log.debug('d');
  log.info('i', { epoch: 1 });
  log.warn('w');
  log.error('e');
  assert.equal(lines, ['<7>debug\tagent\td', '<6>info\tagent\ti\tepoch=1', '<4>warn\tagent\tw', '<3>error\tagent\te']);
  configureLogging({ json: true });
  log.warn('j');
  assert.match(lines[4]!, /^<4>\{"time":/);
  assert.is(JSON.parse(lines[4]!.slice(3)).msg, 'j');
  assert.is(journalPrefix('error'), '<3>');
  configureLogging({ journal: false });
  assert.is(journalPrefix('error'), '');
});

test('Envoy\'s lines passed through to the journal get the priority of their level and lose the timestamp', () => {
  const text = '2026-12-01T01:02:03.456789Z\twarning\tenvoy main external/envoy/source/server/server.cc:1\tsomething odd\tthread=12';
  assert.is(journalLine(text, true), '<4>warning\tenvoy main external/envoy/source/server/server.cc:1\tsomething odd\tthread=12');
  assert.is(journalLine(text.replace('warning', 'critical'), true).slice(0, 3), '<2>');
  assert.is(journalLine(text, false), text);
  assert.is(journalLine('{"level":"error","time":"x","msg":"bad"}', true), '<3>{"level":"error","time":"x","msg":"bad"}');
  assert.is(journalLine('[2026-12-01 01:02:03.456][12][info][main] old format', true), '<6>[2026-12-01 01:02:03.456][12][info][main] old format');
});

test('JOURNAL_STREAM counts only when it names the very file stderr is (a child that redirected it does not)', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pa-journal-'));
  const fd = fs.openSync(path.join(dir, 'stderr'), 'w');
  try {
    const st = fs.fstatSync(fd);
    assert.is(stderrIsJournal(`${st.dev}:${st.ino}`, fd), true);
    assert.is(stderrIsJournal(`${st.dev}:${st.ino + 1}`, fd), false);
    assert.is(stderrIsJournal('', fd), false);
    assert.is(stderrIsJournal(undefined, fd), false);
  } finally {
    fs.closeSync(fd);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test.run();

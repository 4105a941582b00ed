import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { PassThrough } from 'node:stream';
import { spawn } from 'node:child_process';
import { eachLine, MAX_LINE_CHARS, OutputTail } from '../lib/envoy-process';

test('the failure reason is Envoy\'s last critical or error line, in any of its log formats', () => {
  const text = new OutputTail();
  text.push('2026-11-30T05:11:13.560158Z\tinfo\tenvoy main server.cc:1\tstarting\tthread=1');
  text.push("2026-11-30T05:11:13.560158Z\tcritical\tenvoy main server.cc:449\terror initializing config: cannot bind '127.0.0.1:80'\tthread=1");
  text.push('2026-11-30T05:11:13.560158Z\tinfo\tenvoy main server.cc:9\texiting\tthread=1');
  assert.is(text.reason(), "error initializing config: cannot bind '127.0.0.1:80'");

  const json = new OutputTail();
  json.push('{"level":"critical","time":"t","scope":"envoy main","msg":"cannot bind \\"x\\"","caller":"c","thread":"1"}');
  assert.is(json.reason(), 'cannot bind "x"');

  const plain = new OutputTail();
  plain.push('[2026-11-30 04:20:49.067][5438][critical][main] [source/server/server.cc:449] error `cannot bind`');
  assert.match(plain.reason(), /error `cannot bind`/);

  // A panic (here: a hot restart whose shared memory was taken away) is followed by a backtrace; the panic is the reason.
  const panic = new OutputTail();
  for (const l of [
    '[2026-12-01 01:22:59.271][28923][critical][assert] [source/server/hot_restart_impl.cc:44] panic: cannot open shared memory region /envoy_shared_memory_9876540 check user permissions. Error: No such file or directory',
    '[2026-12-01 01:22:59.271][28923][critical][backtrace] [./source/server/backtrace.h:173] Caught Aborted, suspect faulting address 0x70fb',
    '[2026-12-01 01:22:59.271][28923][critical][backtrace] [./source/server/backtrace.h:157] Backtrace (use tools/stack_decode.py to get line numbers):',
    '[2026-12-01 01:22:59.283][28923][critical][backtrace] [./source/server/backtrace.h:167] #0: [0x7f6c2849f050]',
  ]) panic.push(l);
  assert.is(panic.reason(), 'panic: cannot open shared memory region /envoy_shared_memory_9876540 check user permissions. Error: No such file or directory');

  const crash = new OutputTail();
  crash.push('2026-11-30T05:11:13.560158Z\tcritical\tenvoy backtrace backtrace.h:173\tCaught Segmentation fault, suspect faulting address 0x0\tthread=1');
  crash.push('2026-11-30T05:11:13.560158Z\tcritical\tenvoy backtrace backtrace.h:167\t#0: [0x7f6c2849f050]\tthread=1');
  assert.is(crash.reason(), 'Caught Segmentation fault, suspect faulting address 0x0');

  const tail = new OutputTail(2);
  for (const l of ['a', 'b', 'c']) tail.push(l);
  assert.is(tail.text(), 'b\nc', 'only the tail is kept');
});

test('Envoy\'s output is passed on line by line: across chunks, CRLF, a split UTF-8 character, the last unterminated line, an endless one cut', async () => {
  const s = new PassThrough();
  const got: string[] = [];
  eachLine(s, (l) => got.push(l));
  const done = new Promise((r) => s.on('end', r));
  const euro = Buffer.from('\u20ac'); // 3 bytes, written in two chunks
  s.write('first li');
  s.write('ne\nsecond\r\n\nprice ');
  s.write(euro.subarray(0, 1));
  s.write(Buffer.concat([euro.subarray(1), Buffer.from('5\n')]));
  s.write('x'.repeat(MAX_LINE_CHARS * 2 + 10));
  s.write('\nlast, no newline');
  s.end();
  await done;
  assert.equal(got, [
    'first line',
    'second',
    '',
    'price \u20ac5',
    'x'.repeat(MAX_LINE_CHARS),
    'x'.repeat(MAX_LINE_CHARS),
    'x'.repeat(10),
    'last, no newline',
  ]);

  // From a real child's stderr pipe, as the supervisor reads Envoy's.
  const child = spawn('sh', ['-c', 'printf "a\\nb\\r\\nc" >&2'], { stdio: ['ignore', 'ignore', 'pipe'] });
  const lines: string[] = [];
  eachLine(child.stderr, (l) => lines.push(l));
  await new Promise((r) => child.stderr.on('end', r));
  assert.equal(lines, ['a', 'b', 'c']);
});

test.run();

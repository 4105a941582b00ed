import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { OutputTail } from '../lib/envoy-process';

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

  const tail = new OutputTail(2);
  for (const l of ['a', 'b', 'c']) tail.push(l);
  assert.is(tail.text(), 'b\nc', 'only the tail is kept');
});

test.run();

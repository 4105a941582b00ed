// Decision logic of the discovery server's policy mapping, without Envoy (the corpus proves the behaviour with
// one): istiod's retry policy conversion, Percent -> FractionalPercent, exportTo and Sidecar egress visibility.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { fractionalPercent, retryPolicy } from '../lib/discovery/gen-http-policy';
import { egressAdmits, exportedTo, hostCovers } from '../lib/discovery/visibility';

test('the default retry policy is istiod\'s: two retries, connection failures only, no status code', () => {
  const p = retryPolicy(undefined)!;
  assert.is(p.retry_on, 'connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes');
  assert.equal(p.num_retries, { value: 2 });
  assert.is(p.retriable_status_codes, undefined);
  assert.is(p.host_selection_retry_max_attempts, 5);
  assert.is((p.retry_host_predicate as unknown[]).length, 1);
});

test('retryOn integers become retriable status codes, and retriable-status-codes is added once', () => {
  const p = retryPolicy({ attempts: 3, retryOn: '5xx, 503,gateway-error,429', perTryTimeoutMs: 1500 })!;
  assert.is(p.retry_on, '5xx,gateway-error,retriable-status-codes');
  assert.equal(p.retriable_status_codes, [503, 429]);
  assert.equal(p.num_retries, { value: 3 });
  assert.equal(p.per_try_timeout, { seconds: 1, nanos: 500_000_000 });
  assert.is(retryPolicy({ attempts: 1, retryOn: 'retriable-status-codes,502' })!.retry_on, 'retriable-status-codes');
});

test('attempts 0 disables retries; consistent hashing keeps retries on the same host', () => {
  assert.is(retryPolicy({ attempts: 0 }), undefined);
  assert.is(retryPolicy(undefined, true)!.retry_host_predicate, undefined);
});

test('percentages are per million, 100% when unset', () => {
  assert.equal(fractionalPercent(undefined), { numerator: 1_000_000, denominator: 'MILLION' });
  assert.equal(fractionalPercent(0.1), { numerator: 1000, denominator: 'MILLION' });
});

test('exportTo: empty and * are everywhere, . is the own namespace, ~ nowhere, names are those namespaces', () => {
  assert.ok(exportedTo(undefined, 'a', 'b'));
  assert.ok(exportedTo(['*'], 'a', 'b'));
  assert.ok(exportedTo(['.'], 'a', 'a'));
  assert.not.ok(exportedTo(['.'], 'a', 'b'));
  assert.not.ok(exportedTo(['~'], 'a', 'a'));
  assert.ok(exportedTo(['.', 'c'], 'a', 'c'));
});

test('Sidecar egress hosts admit by namespace and host pattern', () => {
  assert.ok(egressAdmits('./*', 'app', 'x.example', 'app'));
  assert.not.ok(egressAdmits('./*', 'app', 'x.example', 'other'));
  assert.ok(egressAdmits('*/*.example', 'app', 'x.example', 'other'));
  assert.not.ok(egressAdmits('*/*.example', 'app', 'example', 'other'));
  assert.ok(egressAdmits('other/x.example', 'app', 'x.example', 'other'));
  assert.not.ok(egressAdmits('~/*', 'app', 'x.example', 'app'));
  assert.ok(hostCovers('*.example', '*.a.example'));
  assert.not.ok(hostCovers('*.a.example', '*.example'));
});

test.run();

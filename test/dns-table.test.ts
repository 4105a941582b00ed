// The DNS lookup table built from a NameTable: Istio's name expansions, the search-domain CNAME, wildcards, the
// NOERROR-without-records case, and rejection of tables with bad entries.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { buildDnsTable, type DnsTable, domainSuffix, lookup, validateNameTable } from '../lib/dns-table';
import type { NameTable } from '../lib/xds-istio';

const opts = { proxyNamespace: 'ns1', proxyDomain: 'ns1.svc.cluster.local', searchDomains: ['ns1.svc.cluster.local', 'svc.cluster.local', 'cluster.local'] };

const nt: NameTable = {
  table: {
    'reviews.ns1.svc.cluster.local': { ips: ['10.0.0.1', '10.0.0.2'], registry: 'Kubernetes', shortname: 'reviews', namespace: 'ns1' },
    'ratings.ns2.svc.cluster.local': { ips: ['10.0.0.3', 'fd00::3'], registry: 'Kubernetes', shortname: 'ratings', namespace: 'ns2' },
    'api.example.com': { ips: ['240.240.0.1'], registry: 'External', shortname: '', namespace: '' },
    'v6only.example.com': { ips: ['2001:db8::1'], registry: 'External', shortname: '', namespace: '' },
    '*.wild.example.com': { ips: ['240.240.0.9'], registry: 'External', shortname: '', namespace: '' },
    'mcs.ns1.svc.clusterset.local': { ips: ['10.0.0.7'], registry: 'Kubernetes', shortname: '', namespace: '' },
  },
};

const ips = (t: DnsTable, type: string, name: string) => lookup(t, type, name)?.answers.filter((a) => a.type === type).map((a) => a.data).sort();

test('a Kubernetes host answers to its FQDN, name.ns., name.ns.svc. and, in the proxy namespace, name.', () => {
  const t = buildDnsTable(nt, opts);
  for (const n of ['reviews.ns1.svc.cluster.local.', 'reviews.ns1.', 'reviews.ns1.svc.', 'reviews.', 'REVIEWS.NS1.SVC.CLUSTER.LOCAL']) {
    assert.equal(ips(t, 'A', n), ['10.0.0.1', '10.0.0.2'], n);
  }
  assert.equal(ips(t, 'A', 'ratings.ns2.'), ['10.0.0.3']);
  assert.equal(ips(t, 'A', 'ratings.ns2.svc.'), ['10.0.0.3']);
  assert.is(lookup(t, 'A', 'ratings.'), undefined, 'short name only for the proxy namespace');
  assert.is(lookup(t, 'A', 'reviews.ns1.svc.cluster.'), undefined, 'only the .svc variant is generated');
});

test('answers keep the spelling of the question', () => {
  const t = buildDnsTable(nt, opts);
  assert.equal(lookup(t, 'A', 'Api.Example.COM.')!.answers, [{ type: 'A', name: 'Api.Example.COM.', data: '240.240.0.1' }]);
});

test('non-Kubernetes hosts and hosts outside the proxy domain answer only to their FQDN', () => {
  const t = buildDnsTable(nt, opts);
  assert.equal(ips(t, 'A', 'api.example.com.'), ['240.240.0.1']);
  assert.equal(ips(t, 'A', 'mcs.ns1.svc.clusterset.local.'), ['10.0.0.7']);
  assert.is(lookup(t, 'A', 'mcs.ns1.'), undefined);
  assert.is(lookup(t, 'A', 'api.'), undefined);
});

test('the name plus the first search domain is a CNAME to the name, answered with the address in one response', () => {
  const t = buildDnsTable(nt, opts);
  const r = lookup(t, 'A', 'api.example.com.ns1.svc.cluster.local.')!;
  assert.equal(r.answers, [
    { type: 'CNAME', name: 'api.example.com.ns1.svc.cluster.local.', data: 'api.example.com.' },
    { type: 'A', name: 'api.example.com.', data: '240.240.0.1' },
  ]);
  // reviews. + search = reviews.ns1.svc.cluster.local., which is a real name: no alias, plain answer.
  assert.equal(lookup(t, 'A', 'reviews.ns1.svc.cluster.local.')!.answers.map((a) => a.type), ['A', 'A']);
  assert.equal(lookup(t, 'A', 'reviews.ns1.ns1.svc.cluster.local.')!.answers[0], { type: 'CNAME', name: 'reviews.ns1.ns1.svc.cluster.local.', data: 'reviews.ns1.' });
  assert.is(lookup(t, 'A', 'api.example.com.svc.cluster.local.'), undefined, 'only the first search domain');
  assert.is(lookup(t, 'A', 'reviews.ns1.svc.cluster.local.ns1.svc.cluster.local.'), undefined, 'no alias for a name already in the search domain');
});

test('wildcard hosts answer any name below them with the asked name; the CNAME trick points at the concrete name', () => {
  const t = buildDnsTable(nt, opts);
  assert.equal(lookup(t, 'A', 'a.wild.example.com.')!.answers, [{ type: 'A', name: 'a.wild.example.com.', data: '240.240.0.9' }]);
  assert.equal(ips(t, 'A', 'x.y.wild.example.com.'), ['240.240.0.9']);
  assert.is(lookup(t, 'A', 'wild.example.com.'), undefined, 'the wildcard does not cover its own apex');
  assert.equal(lookup(t, 'A', 'b.wild.example.com.ns1.svc.cluster.local.')!.answers, [
    { type: 'CNAME', name: 'b.wild.example.com.ns1.svc.cluster.local.', data: 'b.wild.example.com.' },
    { type: 'A', name: 'b.wild.example.com.', data: '240.240.0.9' },
  ]);
});

test('a known name without the asked family is found with no records (NOERROR), other types are not ours', () => {
  const t = buildDnsTable(nt, opts);
  assert.equal(lookup(t, 'AAAA', 'api.example.com.'), { answers: [] });
  assert.equal(lookup(t, 'A', 'v6only.example.com.'), { answers: [] });
  assert.equal(ips(t, 'AAAA', 'v6only.example.com.'), ['2001:db8::1']);
  assert.equal(ips(t, 'AAAA', 'ratings.ns2.'), ['fd00::3']);
  assert.equal(lookup(t, 'AAAA', 'api.example.com.ns1.svc.cluster.local.'), { answers: [] });
  assert.is(lookup(t, 'MX', 'api.example.com.'), undefined);
  assert.is(lookup(t, 'TXT', 'reviews.'), undefined);
  assert.is(lookup(t, 'A', 'www.google.com.'), undefined);
});

test('no search domains: no aliases; an empty proxy domain: FQDN only', () => {
  const t = buildDnsTable(nt, { ...opts, searchDomains: [] });
  assert.is(t.cname.size, 0);
  const t2 = buildDnsTable(nt, { ...opts, proxyDomain: '' });
  assert.is(lookup(t2, 'A', 'reviews.'), undefined);
  assert.equal(ips(t2, 'A', 'reviews.ns1.svc.cluster.local.'), ['10.0.0.1', '10.0.0.2']);
});

test('the proxy domain drops a leading namespace', () => {
  assert.is(domainSuffix('ns1.svc.cluster.local', 'ns1'), 'svc.cluster.local');
  assert.is(domainSuffix('svc.cluster.local', 'ns1'), 'svc.cluster.local');
});

test('a host\'s own FQDN wins over another host\'s expansion, whatever the map order', () => {
  const clash: NameTable = {
    table: {
      'a.ns1.svc.cluster.local': { ips: ['10.1.1.1'], registry: 'Kubernetes', shortname: 'a', namespace: 'ns1' },
      'a.ns1': { ips: ['10.2.2.2'], registry: 'External', shortname: '', namespace: '' },
    },
  };
  const t = buildDnsTable(clash, opts);
  assert.equal(ips(t, 'A', 'a.ns1.'), ['10.2.2.2']);
  assert.equal(ips(t, 'A', 'a.'), ['10.1.1.1']);
});

test('a table with bad entries is rejected, naming each one', () => {
  const bad: NameTable = {
    table: {
      'ok.example.com': { ips: ['1.2.3.4'], registry: 'External', shortname: '', namespace: '' },
      'bad..name': { ips: ['1.2.3.4'], registry: 'External', shortname: '', namespace: '' },
      'noip.example.com': { ips: [], registry: 'External', shortname: '', namespace: '' },
      'badip.example.com': { ips: ['1.2.3.999'], registry: 'External', shortname: '', namespace: '' },
      'x.ns.svc.cluster.local': { ips: ['1.2.3.4'], registry: 'Kubernetes', shortname: 'has space', namespace: 'ns' },
      [`${'a'.repeat(64)}.com`]: { ips: ['1.2.3.4'], registry: 'External', shortname: '', namespace: '' },
    },
  };
  const problems = validateNameTable(bad);
  assert.is(problems.length, 5, problems.join('\n'));
  for (const h of ['bad..name', 'noip.example.com', '1.2.3.999', 'has space', 'aaaa']) assert.ok(problems.some((p) => p.includes(h)), h);
  assert.throws(() => buildDnsTable(bad, opts), /name table rejected: .*bad\.\.name/);
  assert.equal(validateNameTable(nt), []);
});

test('a large table builds and answers', () => {
  const table: NameTable['table'] = {};
  for (let i = 0; i < 10_000; i++) table[`svc${i}.ns${i % 50}.svc.cluster.local`] = { ips: [`10.${i >> 8}.${i & 255}.1`], registry: 'Kubernetes', shortname: `svc${i}`, namespace: `ns${i % 50}` };
  const t = buildDnsTable({ table }, opts);
  assert.is(t.hosts, 10_000);
  assert.equal(ips(t, 'A', 'svc9999.ns49.'), ['10.39.15.1']);
  assert.equal(ips(t, 'A', 'svc51.'), ['10.0.51.1']);
  assert.is(lookup(t, 'A', 'svc50.'), undefined);
});

test.run();

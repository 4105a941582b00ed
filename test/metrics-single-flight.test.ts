// Concurrent scrapes of the merged metrics share one merge: a flood of scrapes on 15020 (any host can send one)
// costs one fetch of each source, not one per request; scrapes that come after it finished get a fresh merge.
// (The hostile-peer suite's scrape flood is the same against the real agent and Envoy.)

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Registry } from 'prom-client';
import { mergedScrape, type MetricsSource } from '../lib/metrics';

test('concurrent scrapes share one merge per Accept header; later scrapes merge again; each scrape is counted', async () => {
  const registry = new Registry();
  let fetches = 0;
  let release: () => void = () => {};
  const gate = new Promise<void>((r) => (release = r));
  const envoy: MetricsSource = {
    name: 'envoy', type: 'envoy',
    async scrape() {
      const n = ++fetches;
      await gate;
      return { ok: true, text: `# TYPE envoy_server_live gauge\nenvoy_server_live ${n}\n` };
    },
  };
  const merged = mergedScrape(registry, [envoy]);
  const texts = Array.from({ length: 200 }, () => merged('text/plain'));
  const open = Array.from({ length: 5 }, () => merged('application/openmetrics-text; version=1.0.0'));
  release();
  const got = await Promise.all([...texts, ...open]);
  assert.is(fetches, 2, 'one fetch for each Accept header');
  assert.is(new Set(got.slice(0, 200).map((g) => g.body)).size, 1);
  assert.match(got[0]!.body, /envoy_server_live 1/);
  assert.match(got[200]!.contentType, /openmetrics/);
  const later = await merged('text/plain');
  assert.is(fetches, 3, 'a scrape after the merge finished is a new merge');
  assert.match(later.body, /envoy_server_live 3/);
  assert.match(await registry.getSingleMetricAsString('istio_agent_scrapes_total'), /istio_agent_scrapes_total 206/);
});

test.run();

// The CA calls under the Go agent's metric names (security/pkg/nodeagent/cache/monitoring.go and
// security/pkg/monitoring/monitoring.go, exported with the istio_agent_ prefix): a CA that cannot be reached counts
// a request and a failure per call, and each call after a failed one a retry. (An answered call, end to end with
// the embedded CA: test/go-knobs-certs.test.ts.)

import * as path from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { CaClient } from '../lib/ca-client';
import { generateKeyAndCsr } from '../lib/csr';
import { newRegistry } from '../lib/metrics';
import { tempDir } from './helpers/harness';

test('a CA that is down: requests, failures and retries under Go\'s names, request_type="csr"', async () => {
  const dir = tempDir('pa-knobs-ca-');
  try {
    const client = new CaClient({ address: `unix:${path.join(dir.path, 'nobody-listens.sock')}`, tls: false, rootCaFile: 'SYSTEM', serverName: '', headers: {}, timeoutMs: 2000 });
    const registry = newRegistry({ defaultMetrics: false });
    client.registerMetrics(registry);
    const { csrPem } = await generateKeyAndCsr({ identity: 'spiffe://cluster.local/ns/a/sa/b', algorithm: { kind: 'ECDSA' } });
    for (let i = 0; i < 3; i++) await client.sign(csrPem, 3600).then(() => assert.unreachable('signed'), (e: Error) => assert.match(e.message, /CA unix:/));
    const text = await registry.metrics();
    assert.match(text, /^# TYPE istio_agent_num_outgoing_requests counter$/m);
    assert.match(text, /^istio_agent_num_outgoing_requests\{request_type="csr"\} 3$/m);
    assert.match(text, /^istio_agent_num_failed_outgoing_requests\{request_type="csr"\} 3$/m);
    assert.match(text, /^istio_agent_num_outgoing_retries\{request_type="csr"\} 2$/m);
    assert.match(text, /^istio_agent_outgoing_latency\{request_type="csr"\} [0-9.e+-]+$/m);
  } finally {
    dir.cleanup();
  }
});

test.run();

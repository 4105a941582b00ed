#!/usr/bin/env node
// Two local HTTP backends for the standalone example: "v1" on 127.0.0.1:9081 and "v2" on 127.0.0.1:9082.
// Each answers every request with its version and the path it saw. Ports: BACKEND_V1_PORT, BACKEND_V2_PORT.
'use strict';
const http = require('node:http');

const backends = [
  { version: 'v1', port: Number(process.env.BACKEND_V1_PORT || 9081) },
  { version: 'v2', port: Number(process.env.BACKEND_V2_PORT || 9082) },
];

const servers = backends.map(({ version, port }) => {
  const server = http.createServer((req, res) => {
    req.resume();
    res.setHeader('content-type', 'text/plain');
    res.end(`${version} ${req.url}\n`);
  });
  server.listen(port, '127.0.0.1', () => console.log(`backend ${version} listening on 127.0.0.1:${port}`));
  server.on('error', (e) => {
    console.error(`backend ${version}: ${e.message}`);
    process.exit(1);
  });
  return server;
});

for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => {
    for (const s of servers) s.close();
    process.exit(0);
  });
}

// One HTTP GET from inside a container for test/packaging.test.ts: node get.js URL [HOST] [NAME:VALUE...]
// Prints "<status> <body>" (body trimmed); exit 0 even for non-200, 1 when no response came.
'use strict';
const http = require('node:http');
const [url, host, ...hdrs] = process.argv.slice(2);
const headers = {};
if (host) headers.host = host;
for (const h of hdrs) headers[h.slice(0, h.indexOf(':'))] = h.slice(h.indexOf(':') + 1);
const req = http.get(url, { headers, timeout: 10_000 }, (res) => {
  let body = '';
  res.on('data', (c) => (body += c));
  res.on('end', () => console.log(`${res.statusCode} ${body.trim()}`));
});
req.on('timeout', () => req.destroy(new Error('timeout')));
req.on('error', (e) => {
  console.log(`error ${e.code || e.message}`);
  process.exitCode = 1;
});

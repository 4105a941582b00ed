// Load from inside a container for test/packaging.test.ts (run by the host's node, mounted in): GET requests on
// keep-alive connections and on a new connection each, until STOP_FILE exists. Every 200 ms and at the end it
// writes {ok, failed, errors, lastOkAt, firstFailAt} to OUT_FILE. Usage: node load.js URL HOST OUT_FILE STOP_FILE
'use strict';
const http = require('node:http');
const fs = require('node:fs');
const [url, host, outFile, stopFile] = process.argv.slice(2);
const stats = { ok: 0, failed: 0, errors: {}, lastOkAt: 0, firstFailAt: 0 };
const keepAlive = new http.Agent({ keepAlive: true, maxSockets: 2 });
let stopping = false;

function once(agent) {
  return new Promise((resolve) => {
    const req = http.get(url, { agent, headers: { host }, timeout: 10_000 }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode === 200 ? null : `HTTP ${res.statusCode}`));
      res.on('error', (e) => resolve(e.code || e.message));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', (e) => resolve(e.code || e.message));
  });
}

async function loop(agent) {
  while (!stopping) {
    const err = await once(agent);
    if (err === null) {
      stats.ok++;
      stats.lastOkAt = Date.now();
    } else {
      stats.failed++;
      stats.errors[err] = (stats.errors[err] || 0) + 1;
      if (!stats.firstFailAt) stats.firstFailAt = Date.now();
      await new Promise((r) => setTimeout(r, 20));
    }
  }
}

const write = () => fs.writeFileSync(outFile + '.tmp', JSON.stringify(stats)) || fs.renameSync(outFile + '.tmp', outFile);
const timer = setInterval(() => {
  write();
  if (fs.existsSync(stopFile)) stopping = true;
}, 200);
Promise.all([loop(keepAlive), loop(keepAlive), loop(false), loop(false)]).then(() => {
  clearInterval(timer);
  write();
  keepAlive.destroy();
});

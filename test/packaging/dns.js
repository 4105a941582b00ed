// One DNS question from inside a container for test/packaging-vm-ca.test.ts: node dns.js SERVER NAME
// Prints the A records, comma-separated, or "error <code>" (exit 1).
'use strict';
const { Resolver } = require('node:dns').promises;
const [server, name] = process.argv.slice(2);
const r = new Resolver({ timeout: 2000, tries: 1 });
r.setServers([server]);
r.resolve4(name).then(
  (a) => console.log(a.join(',')),
  (e) => {
    console.log(`error ${e.code || e.message}`);
    process.exitCode = 1;
  },
);

// Entry of the executable when built with a V8 startup snapshot (PILOT_AGENT_SNAPSHOT=1 scripts/build.sh).
// At build time Node runs this file once: everything agent.ts loads at top level is evaluated and the work that
// does not depend on the command line or the environment is done (see lib/snapshot-warm.ts); the heap is then
// saved into the executable, and each start deserialises it and calls runCli() instead of evaluating the bundle.
// What this evaluates must not open sockets, start timers, add process listeners or read process.env at top
// level; @grpc/grpc-js and http/http2/https/tls stay behind dynamic imports (Node 20's snapshot builder
// could not hold them; not retried on Node 24).

import * as v8 from 'node:v8';
import { runCli } from './agent';
import { warmForSnapshot } from './lib/snapshot-warm';

if (v8.startupSnapshot?.isBuildingSnapshot()) {
  warmForSnapshot();
  v8.startupSnapshot.setDeserializeMainFunction(() => runCli());
} else {
  runCli();
}

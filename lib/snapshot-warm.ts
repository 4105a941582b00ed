// Work done once at build time inside the V8 startup snapshot (agent-snapshot.ts), so no start pays for it:
// protobufjs building Envoy's and Istio's message types from their JSON descriptors and generating the
// encoders/decoders of the types the agent and its discovery server use.

import { envoyRoot } from './envoy-protos';
import { istioRoot } from './xds-istio';

export function warmForSnapshot(): void {
  envoyRoot();
  istioRoot();
}

// Readiness of a proxyless agent (DISABLE_ENVOY), as Istio's grpcready probe decides it: the gRPC bootstrap can be
// read and parsed (once; it is written at start-up and not again), and the certificate files its `file_watcher`
// provider names all exist. It does not wait for a gRPC client to connect: the app is what connects, and with
// holdApplicationUntilProxyStarts it is started only once this agent is ready.

import * as fs from 'node:fs';
import type { Component, Condition } from './component';
import { closedSignal } from './component';
import { errorMessage } from './errors';
import { fileWatcherFiles } from './grpc-bootstrap';

export class GrpcReady implements Component {
  readonly name = 'gRPC bootstrap';
  private readonly signal = closedSignal();
  readonly closed = this.signal.closed;
  private certFiles: string[] | undefined;
  private loaded = false;

  constructor(
    private readonly bootstrapPath: string,
    private readonly exists: (p: string) => boolean = fs.existsSync,
  ) {}

  async start(): Promise<void> {}

  async close(): Promise<void> {
    this.signal.resolve(undefined);
  }

  readiness(): Condition {
    if (!this.loaded) {
      try {
        this.certFiles = fileWatcherFiles(JSON.parse(fs.readFileSync(this.bootstrapPath, 'utf8'))) ?? [];
        this.loaded = true;
      } catch (e) {
        return { ready: false, reason: `failed loading ${this.bootstrapPath}: ${errorMessage(e)}` };
      }
    }
    const missing = this.certFiles!.filter((f) => !this.exists(f));
    return missing.length ? { ready: false, reason: `${missing[0]} does not exist` } : { ready: true, reason: '' };
  }
}

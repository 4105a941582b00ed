// Envoy's command line for one epoch. Pure: the supervisor owns the epoch counter and the base id.
// Hot restart stays enabled (no --disable-hot-restart): a new epoch takes over the listen sockets of the old one.

import type { AgentConfig } from './config';
import { AgentError } from './errors';

/**
 * Envoy's hot-restart domain. `dynamic` lets epoch 0 pick a free id and write it to `path`; later epochs must
 * pass the id read back from that file, because only epoch 0 may choose.
 */
export type BaseId = { dynamic: true; path: string } | { dynamic?: false; id: number };

export interface EnvoyArgsInputs {
  cfg: AgentConfig;
  configFile: string;
  epoch: number;
  baseId: BaseId;
  ipv6: boolean;
  coreDump?: boolean;
  /**
   * A file path for Envoy's hot-restart sockets. Envoy's default is the abstract namespace, which has no
   * permissions: any uid in the network namespace could send it Terminate or take its listen sockets.
   */
  hotRestartSocket?: string;
}

export function bootstrapFileName(epoch: number): string {
  return `envoy-rev${epoch}.json`;
}

// Envoy takes whole seconds; rounding up never drains for less than asked.
const seconds = (ms: number) => String(Math.ceil(ms / 1000));

function baseIdArgs(baseId: BaseId, epoch: number): string[] {
  if (baseId.dynamic) {
    if (epoch !== 0) {
      throw new AgentError(
        'INTERNAL',
        `epoch ${epoch} needs the base id that epoch 0 wrote to ${baseId.path}, not a dynamic one`,
      );
    }
    return ['--use-dynamic-base-id', '--base-id-path', baseId.path];
  }
  if (!Number.isInteger(baseId.id) || baseId.id < 0)
    throw new AgentError('INTERNAL', `invalid Envoy base id ${baseId.id}`);
  return ['--base-id', String(baseId.id)];
}

export function envoyArgs(i: EnvoyArgsInputs): string[] {
  const { cfg, epoch } = i;
  if (!Number.isInteger(epoch) || epoch < 0) throw new AgentError('INTERNAL', `invalid restart epoch ${epoch}`);
  const p = cfg.proxy;
  const args = [
    '-c',
    i.configFile,
    '--restart-epoch',
    String(epoch),
    ...baseIdArgs(i.baseId, epoch),
    '--drain-time-s',
    seconds(p.drainDuration),
    '--parent-shutdown-time-s',
    seconds(p.parentShutdownDuration),
    '--drain-strategy',
    'immediate',
    '--local-address-ip-version',
    i.ipv6 ? 'v6' : 'v4',
    '--file-flush-interval-msec',
    String(Math.round(p.fileFlushInterval)),
    '--allow-unknown-static-fields',
    '-l',
    cfg.proxyLogLevel,
  ];
  if (cfg.componentLogLevel) args.push('--component-log-level', cfg.componentLogLevel);
  if (cfg.concurrency !== undefined && cfg.concurrency > 0) args.push('--concurrency', String(cfg.concurrency));
  if (cfg.skipDeprecatedLogs) args.push('--skip-deprecated-logs');
  if (i.coreDump) args.push('--enable-core-dump');
  // 600: only Envoy's own uid (every epoch runs as the same user) may connect.
  if (i.hotRestartSocket) args.push('--socket-path', i.hotRestartSocket, '--socket-mode', '600');
  if (p.fileFlushMinSize > 0) args.push('--file-flush-min-size-kb', String(p.fileFlushMinSize));
  return args;
}

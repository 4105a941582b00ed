// A gRPC channel that makes one connection attempt and never retries by itself, for callers that own their
// reconnect backoff (the xDS proxy opens a fresh channel for every attempt and closes it when the attempt fails).
//
// grpc-js's pick_first keeps reconnecting a failed address on the channel's own backoff (1 s growing 1.6x to
// 120 s), and a subchannel whose channel was closed while in that backoff still connects once more when it ends:
// that connection is never used and stays open until the server closes it. Here pick_first runs as usual, but
// each subchannel connects only the first time it is asked, and only the first address list from the resolver is
// tried, so a failed attempt leaves nothing behind. A local subchannel pool keeps channels from sharing a
// subchannel that is still in another channel's backoff.

import * as grpc from '@grpc/grpc-js';
import type { ChannelOptions } from '@grpc/grpc-js';

const { experimental } = grpc;
type Helper = grpc.experimental.ChannelControlHelper;
type Subchannel = grpc.experimental.SubchannelInterface;

const POLICY = 'pilot_agent_connect_once';

class ConnectOnceSubchannel extends experimental.BaseSubchannelWrapper {
  private asked = false;

  override startConnecting(): void {
    if (this.asked) return;
    this.asked = true;
    super.startConnecting();
  }
}

class ConnectOnceConfig implements grpc.experimental.TypedLoadBalancingConfig {
  getLoadBalancerName(): string {
    return POLICY;
  }

  toJsonObject(): object {
    return { [POLICY]: {} };
  }

  static createFromJson(): ConnectOnceConfig {
    return new ConnectOnceConfig();
  }
}

class ConnectOnceBalancer implements grpc.experimental.LoadBalancer {
  private readonly child: grpc.experimental.ChildLoadBalancerHandler;
  private readonly pickFirst = experimental.parseLoadBalancingConfig({ pick_first: {} });
  private gotAddresses = false;

  constructor(helper: Helper) {
    this.child = new experimental.ChildLoadBalancerHandler(
      experimental.createChildChannelControlHelper(helper, {
        createSubchannel: (address, args): Subchannel =>
          new ConnectOnceSubchannel(helper.createSubchannel(address, args)),
      }),
    );
  }

  updateAddressList(
    ...[endpoints, , options, note]: Parameters<grpc.experimental.LoadBalancer['updateAddressList']>
  ): boolean {
    // A re-resolution (pick_first asks for one when every address failed) would start a second round.
    if (this.gotAddresses) return true;
    this.gotAddresses = true;
    return this.child.updateAddressList(endpoints, this.pickFirst, options, note);
  }

  exitIdle(): void {
    this.child.exitIdle();
  }

  resetBackoff(): void {
    // Nothing waits on a backoff here.
  }

  destroy(): void {
    this.child.destroy();
  }

  getTypeName(): string {
    return POLICY;
  }
}

let registered = false;

/** Channel options for a channel that connects at most once (see above). */
export function connectOnceOptions(): ChannelOptions {
  if (!registered) {
    experimental.registerLoadBalancerType(POLICY, ConnectOnceBalancer, ConnectOnceConfig);
    registered = true;
  }
  return {
    'grpc.service_config': JSON.stringify({ loadBalancingConfig: [{ [POLICY]: {} }] }),
    'grpc.use_local_subchannel_pool': 1,
    // No channelz bookkeeping: nothing here reads it, and it costs memory and CPU on every call.
    'grpc.enable_channelz': 0,
  };
}

/**
 * Calls back once the channel is READY, or with an error at the deadline; never after `cancelled()` is true.
 * Unlike Client.waitForReady it never asks the channel to connect, so it cannot revive a closed channel.
 */
export function whenChannelReady(
  channel: ReturnType<grpc.Client['getChannel']>,
  deadline: number,
  cancelled: () => boolean,
  cb: (err?: Error) => void,
): void {
  const check = (): void => {
    if (cancelled()) return;
    const state = channel.getConnectivityState(false);
    if (state === grpc.connectivityState.READY) return cb();
    if (state === grpc.connectivityState.SHUTDOWN) return;
    channel.watchConnectivityState(state, deadline, (err) => {
      if (cancelled()) return;
      if (err) cb(err);
      else check();
    });
  };
  check();
}

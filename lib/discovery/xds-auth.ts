// Who is on an ADS stream, decided once from its first request, before anything else sees it (Istio's XDS_AUTH with
// its JWT authenticator: the proxy's token on the stream's metadata, `authorization: Bearer <token>`).
//
// - No token: an anonymous proxy. It gets the mesh config, as from istiod's plaintext port, but no private key and
//   no say over any WorkloadEntry's health.
// - A token of ca/identities/<ns>/<sa> (./identities.ts): that identity. Tokens are taken only where the server
//   listens on a Unix socket or a loopback address, as the embedded CA takes them: a token that crossed a network
//   in plaintext proves nothing. The node id must claim the identity's namespace, else the stream is refused.
// - The in-process token: `proxy --standalone` runs this server inside the agent, which connects to it with a random
//   token that exists only in the agent's memory. That agent reads every file of the config directory itself, so
//   the token gives it nothing it does not have; it is bound to the agent's own namespace and service account.
// - Any other token: refused (UNAUTHENTICATED), so a misconfigured proxy fails loudly instead of running anonymous.
//   Where the server takes no tokens at all (none declared, or a network address), a token is ignored: the proxy
//   is anonymous, as on istiod's plaintext port.

import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import * as grpc from '@grpc/grpc-js';
import { quote } from '../errors';
import type { Identity, TokenIdentities } from './identities';
import type { Proxy, VerifiedIdentity } from './proxy';

export type AuthVerdict = { ok: true; identity?: VerifiedIdentity } | { ok: false; code: grpc.status; reason: string };

export interface XdsAuthOptions {
  /** The agent that runs this server in its own process, and its identity. */
  inProcess?: Identity;
}

const digest = (s: string) => createHash('sha256').update(s).digest();

export class XdsAuthenticator {
  /** Present it as `authorization: Bearer <inProcessToken>` (only when inProcess was given). */
  readonly inProcessToken: string | undefined;
  private readonly inProcessDigest: Buffer | undefined;
  /** The token files, once the embedded CA has checked them; unset when none are declared or not on a local address. */
  identities: TokenIdentities | undefined;

  constructor(private readonly o: XdsAuthOptions) {
    this.inProcessToken = o.inProcess ? randomBytes(32).toString('base64url') : undefined;
    this.inProcessDigest = this.inProcessToken ? digest(this.inProcessToken) : undefined;
  }

  /** Can any proxy be authenticated here? */
  get enabled(): boolean {
    return !!(this.identities || this.o.inProcess);
  }

  authenticate(metadata: grpc.Metadata, proxy: Proxy): AuthVerdict {
    const values = metadata.get('authorization');
    if (values.length === 0 || !this.enabled) return { ok: true };
    const refuse = (code: grpc.status, reason: string): AuthVerdict => ({ ok: false, code, reason });
    if (values.length > 1) return refuse(grpc.status.UNAUTHENTICATED, 'more than one authorization header');
    const token = /^Bearer\s+(.+)$/i.exec(String(values[0]))?.[1]?.trim();
    if (!token) return refuse(grpc.status.UNAUTHENTICATED, 'the authorization header is not "Bearer <token>"');
    let identity: VerifiedIdentity | undefined;
    if (this.inProcessDigest && timingSafeEqual(digest(token), this.inProcessDigest)) {
      identity = { ...this.o.inProcess!, via: 'in-process' };
    } else {
      const who = this.identities?.identityForToken(token);
      if (who) identity = { ...who, via: 'token' };
    }
    if (!identity) {
      const where = this.identities ? ' under ca/identities' : '';
      return refuse(grpc.status.UNAUTHENTICATED, `the token matches no identity${where}`);
    }
    if (identity.namespace !== proxy.namespace) {
      const who = `${identity.namespace}/${identity.serviceAccount}`;
      const claim = `node id ${quote(proxy.id)} claims namespace ${quote(proxy.namespace)}`;
      return refuse(grpc.status.PERMISSION_DENIED, `the token is for ${who}; ${claim}`);
    }
    return { ok: true, identity };
  }
}

// What serves the well-known SDS sockets at start, as the Go agent checks them (pkg/istio-agent/agent.go Run and
// generateNodeMetadata, checkSocket): the workload SDS socket (WORKLOAD_IDENTITY_SOCKET_FILE in
// ./var/run/secrets/workload-spiffe-uds) and the gateway credential socket (./var/run/secrets/credential-uds/socket).
// A socket file that nobody answers on is removed (a stale one would make Envoy wait on it); one that cannot be is an
// error. A non-default workload socket name with nothing serving it fails the start: the agent serves only the
// default name, so Envoy would get no certificate. Go dials gRPC with a 1 s deadline; a connect is asked here.

import * as fs from 'node:fs';
import * as path from 'node:path';
import { CREDENTIAL_SOCKET, SDS_SOCKET, type SdsSocketFacts } from './config';
import { AgentError, errorMessage } from './errors';
import { scope } from './log';
import { socketInUse } from './unix-socket';

const log = scope('sds');

/** True when a server answers on the socket; a socket file nobody answers on is removed (Go's checkSocket). */
export async function checkSocket(p: string): Promise<boolean> {
  let st: fs.Stats;
  try {
    st = fs.lstatSync(p);
  } catch {
    return false;
  }
  // Go tries anything but a regular file, and removes it when nothing answers; only a socket is tried (and removed)
  // here: a FIFO or a directory in its place is left for the bind to refuse, by name.
  if (!st.isSocket()) return false;
  if (await socketInUse(p)) return true;
  try {
    fs.rmSync(p);
  } catch (e) {
    throw new AgentError('IO', `existing SDS socket ${p} could not be removed: ${errorMessage(e)}`, e);
  }
  log.info(`removed ${p}: nothing answers on it`);
  return false;
}

/** The facts for buildConfig; throws when a non-default workload SDS socket is configured and nothing serves it. */
export async function probeSdsSockets(sdsSocket: string): Promise<SdsSocketFacts> {
  const [externalSds, credentialSocket] = await Promise.all([checkSocket(sdsSocket), checkSocket(CREDENTIAL_SOCKET)]);
  if (!externalSds && sdsSocket !== SDS_SOCKET) {
    // Go's words, and its path (filepath.Join drops the leading ./).
    const p = path.normalize(sdsSocket);
    throw new AgentError(
      'CONFIG_INVALID',
      `agent configured for non-default SDS socket path: ${p} but no socket found ` +
        '(WORKLOAD_IDENTITY_SOCKET_FILE names a socket another SDS server must serve)',
    );
  }
  if (externalSds) log.info(`existing workload SDS socket found at ${sdsSocket}: the agent serves only file secrets`);
  if (credentialSocket) log.info(`credential SDS socket found at ${CREDENTIAL_SOCKET}`);
  return { externalSds, credentialSocket };
}

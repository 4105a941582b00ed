// The identities the discovery server knows: <config dir>/ca/identities/<namespace>/<sa>, one file per identity
// holding its bootstrap token. A caller that presents a token as `authorization: Bearer <token>` is that identity:
// the embedded CA signs its certificate, the ADS server gives its gateway the private keys of its namespace and takes
// its WorkloadEntry's health reports. So a token file is a credential, kept as the CA's root key is kept: owner-only
// (no group or other bits) in directories that only their owner can change. check() refuses anything else at
// start-up, naming the file; a file that is loosened or added loose later is skipped at lookup (logged once).

import { createHash, timingSafeEqual } from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { AgentError, errorMessage } from '../errors';
import { scope } from '../log';

const log = scope('ca');
const LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const MAX_WARNED = 1000;

export interface Identity {
  readonly namespace: string;
  readonly serviceAccount: string;
}

/** Why a token file or its directory may not be trusted, or undefined when it may. */
function looseness(st: fs.Stats, file: boolean): string | undefined {
  const mode = (st.mode & 0o777).toString(8).padStart(4, '0');
  if (file) {
    if (!st.isFile()) return 'is not a regular file';
    if (st.mode & 0o077) return `is readable or writable by group or others (mode ${mode}); want 0600`;
  } else if (st.mode & 0o022) {
    return `is writable by group or others (mode ${mode}); others could add or replace identities`;
  }
  return undefined;
}

export class TokenIdentities {
  private readonly warned = new Set<string>();

  /** `dir`: the identities directory (ca/identities). */
  constructor(readonly dir: string) {}

  /** Throws CONFIG_INVALID naming the first token file or directory that others could read or change. */
  check(): void {
    const bad = (p: string, why: string, fix: string) => {
      throw new AgentError('CONFIG_INVALID', `embedded CA: ${p} ${why}: a token is a credential (${fix} ${p})`);
    };
    const stat = (p: string) => {
      try {
        return fs.statSync(p);
      } catch (e) {
        throw new AgentError('IO', `embedded CA: cannot read ${p}: ${errorMessage(e)}`, e);
      }
    };
    // The ca directory too: whoever can change it can replace the identities directory.
    for (const d of [path.dirname(this.dir), this.dir]) {
      const why = looseness(stat(d), false);
      if (why) bad(d, why, 'chmod go-w');
    }
    for (const ns of this.list(this.dir)) {
      const nsDir = path.join(this.dir, ns);
      const st = stat(nsDir);
      if (!st.isDirectory()) continue;
      const why = looseness(st, false);
      if (why) bad(nsDir, why, 'chmod go-w');
      for (const sa of this.list(nsDir)) {
        const file = path.join(nsDir, sa);
        const w = looseness(stat(file), true);
        if (w) bad(file, w, 'chmod 600');
      }
    }
  }

  /** The identity whose token this is, read from the files at each call (identities can be added while running). */
  identityForToken(token: string): Identity | undefined {
    const want = createHash('sha256').update(token).digest();
    for (const namespace of this.list(this.dir)) {
      const nsDir = path.join(this.dir, namespace);
      for (const serviceAccount of this.list(nsDir)) {
        const file = path.join(nsDir, serviceAccount);
        let t: string;
        try {
          const fd = fs.openSync(file, 'r');
          try {
            // Checked on the open file (a symbolic link's target): a swap between a check and the read changes nothing.
            const why = looseness(fs.fstatSync(fd), true) ?? looseness(fs.statSync(nsDir), false);
            if (why) {
              this.warnOnce(file, `embedded CA: ${file} ${why}; its identity is refused until that is fixed`);
              continue;
            }
            t = fs.readFileSync(fd, 'utf8').trim();
          } finally {
            fs.closeSync(fd);
          }
        } catch {
          continue;
        }
        if (t && timingSafeEqual(createHash('sha256').update(t).digest(), want)) return { namespace, serviceAccount };
      }
    }
    return undefined;
  }

  private list(dir: string): string[] {
    try {
      return fs
        .readdirSync(dir)
        .filter((n) => LABEL.test(n))
        .sort();
    } catch {
      return [];
    }
  }

  private warnOnce(key: string, message: string): void {
    if (this.warned.has(key) || this.warned.size >= MAX_WARNED) return;
    this.warned.add(key);
    log.warn(message);
  }
}

// User and group names to numbers, from /etc/passwd and /etc/group (what a minimal image has; no NSS modules).

import * as fs from 'node:fs';

export interface IdLookup {
  user(name: string): number | undefined;
  group(name: string): number | undefined;
  primaryGroup(uid: number): number | undefined;
}

function readDb(file: string): string[][] {
  try {
    return fs
      .readFileSync(file, 'utf8')
      .split('\n')
      .map((l) => l.split(':'));
  } catch {
    return [];
  }
}

const numberAt = (fields: string[] | undefined, i: number) =>
  fields?.[i] && /^\d+$/.test(fields[i]!) ? Number(fields[i]) : undefined;

export const systemIds: IdLookup = {
  user: (name) =>
    numberAt(
      readDb('/etc/passwd').find((f) => f[0] === name),
      2,
    ),
  group: (name) =>
    numberAt(
      readDb('/etc/group').find((f) => f[0] === name),
      2,
    ),
  primaryGroup: (uid) =>
    numberAt(
      readDb('/etc/passwd').find((f) => f[2] === String(uid)),
      3,
    ),
};

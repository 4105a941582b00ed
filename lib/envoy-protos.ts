// Envoy's protobuf messages, loaded once from the committed descriptor proto/envoy.json (bundled into the binary).
// Regenerate it with `npx tsx scripts/gen-envoy-protos.ts`.

import * as protobuf from 'protobufjs';

let root: protobuf.Root | undefined;

export function envoyRoot(): protobuf.Root {
  if (!root) {
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    root = protobuf.Root.fromJSON(require('../proto/envoy.json'));
  }
  return root;
}

export function messageType(fullName: string): protobuf.Type {
  return envoyRoot().lookupType(fullName.replace(/^type\.googleapis\.com\//, ''));
}

export interface AnyMessage {
  type_url: string;
  value: Uint8Array;
}

export const typeUrl = (fullName: string) => `type.googleapis.com/${fullName}`;

/** Encodes a plain object (Envoy's snake_case field names, as in its docs) as a google.protobuf.Any. */
export function packAny(fullName: string, value: Record<string, unknown>): AnyMessage {
  const t = messageType(fullName);
  const msg = t.fromObject(value);
  const err = t.verify(msg);
  if (err) throw new Error(`invalid ${fullName}: ${err}`);
  return { type_url: typeUrl(fullName), value: t.encode(msg).finish() };
}

export function unpackAny(any: AnyMessage): Record<string, unknown> {
  const t = messageType(any.type_url);
  return t.toObject(t.decode(any.value), { longs: Number, enums: String, defaults: false }) as Record<string, unknown>;
}

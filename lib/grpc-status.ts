// gRPC status codes and their names (https://grpc.io/docs/guides/status-codes/), for the code that must not load
// grpc-js to name one: the CA client's transport, the SDS server's errors, xDS log lines, VirtualService faults.

/** The names in code order: 0 OK ... 16 UNAUTHENTICATED (also Istio's SupportedGRPCStatus). */
export const GRPC_STATUS_NAMES = [
  'OK',
  'CANCELLED',
  'UNKNOWN',
  'INVALID_ARGUMENT',
  'DEADLINE_EXCEEDED',
  'NOT_FOUND',
  'ALREADY_EXISTS',
  'PERMISSION_DENIED',
  'RESOURCE_EXHAUSTED',
  'FAILED_PRECONDITION',
  'ABORTED',
  'OUT_OF_RANGE',
  'UNIMPLEMENTED',
  'INTERNAL',
  'UNAVAILABLE',
  'DATA_LOSS',
  'UNAUTHENTICATED',
] as const;

export type GrpcStatusName = (typeof GRPC_STATUS_NAMES)[number];

/** Each code by name: GrpcStatus.UNAVAILABLE is 14. */
export const GrpcStatus = Object.freeze(
  Object.fromEntries(GRPC_STATUS_NAMES.map((name, code) => [name, code])),
) as Readonly<Record<GrpcStatusName, number>>;

/** The code's name, or `code N` for one outside 0-16. */
export function grpcStatusName(code: number): string {
  return GRPC_STATUS_NAMES[code] ?? `code ${code}`;
}

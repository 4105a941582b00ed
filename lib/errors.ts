// Errors carry a stable code and the cause; each layer prefixes what it was doing.

export type ErrorCode =
  | 'CONFIG_INVALID'
  | 'ENVOY_MISSING'
  | 'ENVOY_FAILED'
  | 'IO'
  | 'BAD_INPUT'
  | 'TIMEOUT'
  | 'UPSTREAM'
  | 'INTERNAL';

export class AgentError extends Error {
  readonly code: ErrorCode;
  constructor(code: ErrorCode, message: string, cause?: unknown) {
    super(message, cause === undefined ? undefined : { cause });
    this.code = code;
    this.name = 'AgentError';
  }
}

/** A configuration error that names the field and where its value came from. */
export function configError(field: string, source: string, problem: string): AgentError {
  return new AgentError('CONFIG_INVALID', `invalid ${field} (from ${source}): ${problem}`);
}

/** Adds what the caller was doing in front of the cause's message, keeping its code. */
export function wrap(doing: string, cause: unknown, code?: ErrorCode): AgentError {
  const inner = cause instanceof AgentError ? cause.code : 'INTERNAL';
  return new AgentError(code ?? inner, `${doing}: ${errorMessage(cause)}`, cause);
}

export function errorMessage(err: unknown): string {
  if (err instanceof Error) return err.message;
  return String(err);
}

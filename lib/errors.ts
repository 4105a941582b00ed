// Errors carry a stable code and the cause; each layer prefixes what it was doing.

export type ErrorCode =
  'CONFIG_INVALID' | 'ENVOY_MISSING' | 'ENVOY_FAILED' | 'IO' | 'BAD_INPUT' | 'TIMEOUT' | 'UPSTREAM' | 'INTERNAL';

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

/**
 * A value as it may appear in a message: JSON-quoted and cut to `max` characters, so that a 50 MB scalar in a
 * config file makes a short log line, not a 50 MB one.
 */
export function quote(value: unknown, max = 200): string {
  let text: string;
  let total: number | undefined;
  if (typeof value === 'string') {
    // Quote only what is shown: stringifying the whole of a huge value would cost as much as logging it.
    text = JSON.stringify(value.length > max ? value.slice(0, max) : value);
    if (value.length > max) total = value.length;
  } else if (
    typeof value === 'number' ||
    typeof value === 'bigint' ||
    typeof value === 'boolean' ||
    value === undefined ||
    value === null
  ) {
    text = String(value);
  } else {
    try {
      text = JSON.stringify(value) ?? String(value);
    } catch {
      text = Object.prototype.toString.call(value);
    }
  }
  if (text.length > max + 2) {
    total ??= text.length;
    text = text.slice(0, max);
  }
  return total === undefined ? text : `${text}... (${total} characters)`;
}

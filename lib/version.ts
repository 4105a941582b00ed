// The agent's version, from package.json (bundled into the executable), and what `pilot-agent version` prints.
// eslint-disable-next-line @typescript-eslint/no-require-imports
export const VERSION: string = (require('../package.json') as { version: string }).version;

/** `version`, `version -s`, `version -o json|yaml` (the shape of Istio's client version, plus the runtime carried). */
export function versionText(output: string, short: boolean): string {
  if (short) return `${VERSION}\n`;
  const info = {
    version: VERSION,
    revision: 'unknown',
    golang_version: `node ${process.version}`,
    status: 'Clean',
    tag: VERSION,
    // The runtime inside the executable (scripts/build.sh pins it): what a security scan of the image must know.
    node: process.version,
    v8: process.versions.v8,
    openssl: process.versions.openssl,
    // Whether V8 took the executable's code cache for the bundle (scripts/sea-main.js): none outside the executable.
    codeCache: (globalThis as { __pilotAgentCodeCache?: string }).__pilotAgentCodeCache ?? 'none',
  };
  if (output === 'json') return JSON.stringify({ clientVersion: info }, null, 2) + '\n';
  if (output === 'yaml')
    return `clientVersion:\n${Object.entries(info)
      .map(([k, v]) => `  ${k}: ${v}`)
      .join('\n')}\n`;
  return `pilot-agent version ${VERSION}\n`;
}

// The agent's version, from package.json (bundled into the executable).
// eslint-disable-next-line @typescript-eslint/no-require-imports
export const VERSION: string = (require('../package.json') as { version: string }).version;

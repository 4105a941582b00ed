// Which VirtualService hosts a Gateway server takes; a leaf module, so the config checks can use it without
// loading the generators.

/** Does a Gateway server host (`[ns/]host`, wildcards allowed) accept a VirtualService host? */
export function serverHostAccepts(serverHost: string, gwNs: string, vsHost: string, vsNs: string): boolean {
  const slash = serverHost.indexOf('/');
  const ns = slash < 0 ? '*' : serverHost.slice(0, slash);
  const host = slash < 0 ? serverHost : serverHost.slice(slash + 1);
  if (ns !== '*' && (ns === '.' ? gwNs : ns) !== vsNs) return false;
  return hostsOverlap(host, vsHost);
}

export function hostsOverlap(a: string, b: string): boolean {
  if (a === '*' || b === '*' || a === b) return true;
  if (a.startsWith('*.') && b.startsWith('*.'))
    return a.length < b.length ? b.endsWith(a.slice(1)) : a.endsWith(b.slice(1));
  if (a.startsWith('*.')) return b.endsWith(a.slice(1));
  if (b.startsWith('*.')) return a.endsWith(b.slice(1));
  return false;
}

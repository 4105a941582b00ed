// A large, valid standalone config for the size-limit and responsiveness tests.

/** ServiceEntries of about 600 bytes each, all on `port`, filling just under `bytes`. Returns the text and count. */
export function manyServices(bytes: number, port = 18099): { text: string; count: number } {
  const parts: string[] = [];
  let size = 0;
  for (let i = 0; ; i++) {
    const d = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata:
  name: svc-${i}
  namespace: big
  labels: {app: svc-${i}, team: platform, tier: backend}
spec:
  hosts: [svc-${i}.big.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports:
  - {number: ${port}, name: http, protocol: HTTP}
  endpoints:
  - {address: 10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}, labels: {version: v1, zone: a}}
  - {address: 10.${100 + ((i >> 16) & 127)}.${(i >> 8) & 255}.${i & 255}, labels: {version: v2, zone: b}}
---
`;
    if (size + d.length > bytes) return { text: parts.join(''), count: i };
    parts.push(d);
    size += d.length;
  }
}

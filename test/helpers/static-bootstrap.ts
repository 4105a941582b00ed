// A static Envoy bootstrap for tests and benchmarks that must not depend on xDS: admin on loopback and one
// direct_response listener answering `body`; optionally a second listener, a route to a loopback backend
// (/slow), or an invalid listener that Envoy's validation rejects.

export function staticBootstrap(p: { admin: number; listen: number }, body: string, opts: { extraListenPort?: number; backendPort?: number; invalid?: boolean } = {}): Record<string, unknown> {
  const hcm = (routes: unknown[]) => ({
    name: 'envoy.filters.network.http_connection_manager',
    typed_config: {
      '@type': 'type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager',
      stat_prefix: 'test',
      route_config: { virtual_hosts: [{ name: 'all', domains: ['*'], routes }] },
      http_filters: [{ name: 'envoy.filters.http.router', typed_config: { '@type': 'type.googleapis.com/envoy.extensions.filters.http.router.v3.Router' } }],
    },
  });
  const listener = (name: string, port: number, routes: unknown[]) => ({
    name,
    address: { socket_address: { address: '127.0.0.1', port_value: port } },
    filter_chains: [{ filters: [hcm(routes)] }],
  });
  const routes: unknown[] = [];
  if (opts.backendPort) routes.push({ match: { prefix: '/slow' }, route: { cluster: 'slow', timeout: '30s' } });
  routes.push({ match: { prefix: '/' }, direct_response: { status: 200, body: { inline_string: body } } });
  const listeners = [listener('main', p.listen, routes)];
  if (opts.extraListenPort) listeners.push(listener('extra', opts.extraListenPort, routes));
  const clusters = opts.backendPort
    ? [{
        name: 'slow',
        type: 'STATIC',
        connect_timeout: '1s',
        load_assignment: { cluster_name: 'slow', endpoints: [{ lb_endpoints: [{ endpoint: { address: { socket_address: { address: '127.0.0.1', port_value: opts.backendPort } } } }] }] },
      }]
    : [];
  const b: Record<string, unknown> = {
    admin: { address: { socket_address: { address: '127.0.0.1', port_value: p.admin } } },
    static_resources: { listeners, clusters },
  };
  if (opts.invalid) (b.static_resources as Record<string, unknown>).listeners = [{ name: 'broken', address: { socket_address: { address: '127.0.0.1', port_value: 'not-a-port' } } }];
  return b;
}

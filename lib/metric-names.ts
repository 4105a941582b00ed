// The Go pilot-agent's metric families (istio.io/istio@v0.0.0-20260827124520-eed52ebb66ad), for exporting the same
// names where this agent measures the same thing (issue 13, item 10). Facts, gathered two ways: every metric the
// packages linked into pilot-agent define (`monitoring.NewSum/NewGauge/NewDistribution/NewDerivedGauge`; the agent
// exports them all with the `istio_agent_` prefix; Sum -> counter, Distribution -> histogram), and a scrape of a
// running Go agent's :15020/stats/prometheus, which also shows the Prometheus Go client's runtime and process
// collectors. `seenAtStartup` says whether the family was in that scrape of an idle agent (families appear once
// first recorded). The go_* families are Go's runtime; this agent's runtime metrics should use their own prefix.

export type GoMetricType = 'counter' | 'gauge' | 'histogram' | 'summary';

export interface GoAgentMetric {
  name: string;
  type: GoMetricType;
  help: string;
  /** Where Istio defines it (a path in istio/istio), or the Prometheus client's collectors. */
  source: string;
  seenAtStartup: boolean;
}

export const GO_AGENT_METRICS: readonly GoAgentMetric[] = [
  { name: 'istio_agent_num_outgoing_retries', type: 'counter', help: 'Number of outgoing retry requests (e.g. to a token exchange server, CA, etc.)', source: 'security/pkg/monitoring/monitoring.go', seenAtStartup: true },
  { name: 'istio_agent_istio_build', type: 'gauge', help: 'Istio component build info', source: 'pkg/version/stats.go', seenAtStartup: false },
  { name: 'istio_agent_startup_duration_seconds', type: 'gauge', help: 'The time from the process starting to being marked ready.', source: 'pilot/cmd/pilot-agent/metrics/metrics.go', seenAtStartup: false },
  { name: 'istio_agent_scrape_failures_total', type: 'counter', help: 'The total number of failed scrapes.', source: 'pilot/cmd/pilot-agent/metrics/metrics.go', seenAtStartup: true },
  { name: 'istio_agent_scrapes_total', type: 'counter', help: 'The total number of scrapes.', source: 'pilot/cmd/pilot-agent/metrics/metrics.go', seenAtStartup: true },
  { name: 'istio_agent_dns_requests_total', type: 'counter', help: 'Total number of DNS requests.', source: 'pkg/dns/client/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_dns_upstream_requests_total', type: 'counter', help: 'Total number of DNS requests forwarded to upstream.', source: 'pkg/dns/client/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_dns_upstream_failures_total', type: 'counter', help: 'Total number of DNS failures.', source: 'pkg/dns/client/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_dns_upstream_request_duration_seconds', type: 'histogram', help: 'Total time in seconds Istio takes to get DNS response from upstream.', source: 'pkg/dns/client/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_istiod_connection_failures', type: 'counter', help: 'The total number of connection failures to Istiod', source: 'pkg/istio-agent/metrics/metrics.go', seenAtStartup: false },
  { name: 'istio_agent_istiod_connection_terminations', type: 'counter', help: 'The total number of connection errors to Istiod', source: 'pkg/istio-agent/metrics/metrics.go', seenAtStartup: false },
  { name: 'istio_agent_envoy_connection_terminations', type: 'counter', help: 'The total number of connection errors from envoy', source: 'pkg/istio-agent/metrics/metrics.go', seenAtStartup: false },
  { name: 'istio_agent_xds_proxy_requests', type: 'counter', help: 'The total number of Xds Proxy Requests', source: 'pkg/istio-agent/metrics/metrics.go', seenAtStartup: false },
  { name: 'istio_agent_xds_proxy_responses', type: 'counter', help: 'The total number of Xds Proxy Responses', source: 'pkg/istio-agent/metrics/metrics.go', seenAtStartup: false },
  { name: 'istio_agent_wasm_cache_entries', type: 'gauge', help: 'number of Wasm remote fetch cache entries.', source: 'pkg/wasm/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_wasm_cache_lookup_count', type: 'counter', help: 'number of Wasm remote fetch cache lookups.', source: 'pkg/wasm/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_wasm_remote_fetch_count', type: 'counter', help: 'number of Wasm remote fetches and results, including success, download failure, and checksum mismatch.', source: 'pkg/wasm/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_wasm_config_conversion_count', type: 'counter', help: 'number of Wasm config conversions and results, including success, no remote load, marshal failure, remote fetch failure, miss remote fetch hint.', source: 'pkg/wasm/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_wasm_config_conversion_duration', type: 'histogram', help: 'Total time in milliseconds istio-agent spends on converting remote load in Wasm config.', source: 'pkg/wasm/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_pilot_total_xds_internal_errors', type: 'counter', help: 'Total number of internal XDS errors in pilot.', source: 'pkg/xds/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_pilot_xds_expired_nonce', type: 'counter', help: 'Total number of XDS requests with an expired nonce.', source: 'pkg/xds/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_pilot_xds_cds_reject', type: 'gauge', help: 'Pilot rejected CDS configs.', source: 'pkg/xds/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_pilot_xds_eds_reject', type: 'gauge', help: 'Pilot rejected EDS.', source: 'pkg/xds/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_pilot_xds_lds_reject', type: 'gauge', help: 'Pilot rejected LDS.', source: 'pkg/xds/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_pilot_xds_rds_reject', type: 'gauge', help: 'Pilot rejected RDS.', source: 'pkg/xds/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_pilot_total_xds_rejects', type: 'counter', help: 'Total number of XDS responses from pilot rejected by proxy.', source: 'pkg/xds/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_pilot_xds_write_timeout', type: 'counter', help: 'Pilot XDS response write timeouts.', source: 'pkg/xds/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_pilot_xds_recv_max', type: 'gauge', help: 'The maximum size request we have received so far.', source: 'pkg/xds/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_pilot_xds_send_time', type: 'histogram', help: 'Total time in seconds Pilot takes to send generated configuration.', source: 'pkg/xds/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_pilot_worker_queue_depth', type: 'gauge', help: 'Depth of the controller queues', source: 'pkg/queue/metrics.go', seenAtStartup: false },
  { name: 'istio_agent_pilot_worker_queue_latency', type: 'histogram', help: 'Latency before the item is processed', source: 'pkg/queue/metrics.go', seenAtStartup: false },
  { name: 'istio_agent_pilot_worker_queue_duration', type: 'histogram', help: 'Time taken to process an item', source: 'pkg/queue/metrics.go', seenAtStartup: false },
  { name: 'istio_agent_outgoing_latency', type: 'counter', help: 'The latency of outgoing requests (e.g. to a token exchange server, CA, etc.) in milliseconds.', source: 'security/pkg/nodeagent/cache/monitoring.go', seenAtStartup: true },
  { name: 'istio_agent_num_outgoing_requests', type: 'counter', help: 'Number of total outgoing requests (e.g. to a token exchange server, CA, etc.)', source: 'security/pkg/nodeagent/cache/monitoring.go', seenAtStartup: true },
  { name: 'istio_agent_num_failed_outgoing_requests', type: 'counter', help: 'Number of failed outgoing requests (e.g. to a token exchange server, CA, etc.)', source: 'security/pkg/nodeagent/cache/monitoring.go', seenAtStartup: true },
  { name: 'istio_agent_num_file_watcher_failures_total', type: 'counter', help: 'Number of times file watcher failed to add watchers', source: 'security/pkg/nodeagent/cache/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_num_file_secret_failures_total', type: 'counter', help: 'Number of times secret generation failed for files', source: 'security/pkg/nodeagent/cache/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_cert_expiry_seconds', type: 'gauge', help: 'The time remaining, in seconds, before the certificate chain will expire. A negative value indicates the cert is expired.', source: 'security/pkg/nodeagent/cache/monitoring.go', seenAtStartup: false },
  { name: 'istio_agent_go_gc_duration_seconds', type: 'summary', help: 'A summary of the wall-time pause (stop-the-world) duration in garbage collection cycles.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_gc_gogc_percent', type: 'gauge', help: 'Heap size target percentage configured by the user, otherwise 100. This value is set by the GOGC environment variable, and the runtime/debug.SetGCPercent function. Sourced from /gc/gogc:percent.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_gc_gomemlimit_bytes', type: 'gauge', help: 'Go runtime memory limit configured by the user, otherwise math.MaxInt64. This value is set by the GOMEMLIMIT environment variable, and the runtime/debug.SetMemoryLimit function. Sourced from /gc/gomemlimit:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_goroutines', type: 'gauge', help: 'Number of goroutines that currently exist.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_info', type: 'gauge', help: 'Information about the Go environment.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_alloc_bytes', type: 'gauge', help: 'Number of bytes allocated in heap and currently in use. Equals to /memory/classes/heap/objects:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_alloc_bytes_total', type: 'counter', help: 'Total number of bytes allocated in heap until now, even if released already. Equals to /gc/heap/allocs:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_buck_hash_sys_bytes', type: 'gauge', help: 'Number of bytes used by the profiling bucket hash table. Equals to /memory/classes/profiling/buckets:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_frees_total', type: 'counter', help: 'Total number of heap objects frees. Equals to /gc/heap/frees:objects + /gc/heap/tiny/allocs:objects.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_gc_sys_bytes', type: 'gauge', help: 'Number of bytes used for garbage collection system metadata. Equals to /memory/classes/metadata/other:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_heap_alloc_bytes', type: 'gauge', help: 'Number of heap bytes allocated and currently in use, same as go_memstats_alloc_bytes. Equals to /memory/classes/heap/objects:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_heap_idle_bytes', type: 'gauge', help: 'Number of heap bytes waiting to be used. Equals to /memory/classes/heap/released:bytes + /memory/classes/heap/free:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_heap_inuse_bytes', type: 'gauge', help: 'Number of heap bytes that are in use. Equals to /memory/classes/heap/objects:bytes + /memory/classes/heap/unused:bytes', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_heap_objects', type: 'gauge', help: 'Number of currently allocated objects. Equals to /gc/heap/objects:objects.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_heap_released_bytes', type: 'gauge', help: 'Number of heap bytes released to OS. Equals to /memory/classes/heap/released:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_heap_sys_bytes', type: 'gauge', help: 'Number of heap bytes obtained from system. Equals to /memory/classes/heap/objects:bytes + /memory/classes/heap/unused:bytes + /memory/classes/heap/released:bytes + /memory/classes/heap/free:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_last_gc_time_seconds', type: 'gauge', help: 'Number of seconds since 1970 of last garbage collection.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_mallocs_total', type: 'counter', help: 'Total number of heap objects allocated, both live and gc-ed. Semantically a counter version for go_memstats_heap_objects gauge. Equals to /gc/heap/allocs:objects + /gc/heap/tiny/allocs:objects.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_mcache_inuse_bytes', type: 'gauge', help: 'Number of bytes in use by mcache structures. Equals to /memory/classes/metadata/mcache/inuse:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_mcache_sys_bytes', type: 'gauge', help: 'Number of bytes used for mcache structures obtained from system. Equals to /memory/classes/metadata/mcache/inuse:bytes + /memory/classes/metadata/mcache/free:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_mspan_inuse_bytes', type: 'gauge', help: 'Number of bytes in use by mspan structures. Equals to /memory/classes/metadata/mspan/inuse:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_mspan_sys_bytes', type: 'gauge', help: 'Number of bytes used for mspan structures obtained from system. Equals to /memory/classes/metadata/mspan/inuse:bytes + /memory/classes/metadata/mspan/free:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_next_gc_bytes', type: 'gauge', help: 'Number of heap bytes when next garbage collection will take place. Equals to /gc/heap/goal:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_other_sys_bytes', type: 'gauge', help: 'Number of bytes used for other system allocations. Equals to /memory/classes/other:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_stack_inuse_bytes', type: 'gauge', help: 'Number of bytes obtained from system for stack allocator in non-CGO environments. Equals to /memory/classes/heap/stacks:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_stack_sys_bytes', type: 'gauge', help: 'Number of bytes obtained from system for stack allocator. Equals to /memory/classes/heap/stacks:bytes + /memory/classes/os-stacks:bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_memstats_sys_bytes', type: 'gauge', help: 'Number of bytes obtained from system. Equals to /memory/classes/total:byte.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_sched_gomaxprocs_threads', type: 'gauge', help: 'The current runtime.GOMAXPROCS setting, or the number of operating system threads that can execute user-level Go code simultaneously. Sourced from /sched/gomaxprocs:threads.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_go_threads', type: 'gauge', help: 'Number of OS threads created.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_process_cpu_seconds_total', type: 'counter', help: 'Total user and system CPU time spent in seconds.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_process_max_fds', type: 'gauge', help: 'Maximum number of open file descriptors.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_process_network_receive_bytes_total', type: 'counter', help: 'Number of bytes received by the process over the network.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_process_network_transmit_bytes_total', type: 'counter', help: 'Number of bytes sent by the process over the network.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_process_open_fds', type: 'gauge', help: 'Number of open file descriptors.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_process_resident_memory_bytes', type: 'gauge', help: 'Resident memory size in bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_process_start_time_seconds', type: 'gauge', help: 'Start time of the process since unix epoch in seconds.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_process_virtual_memory_bytes', type: 'gauge', help: 'Virtual memory size in bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
  { name: 'istio_agent_process_virtual_memory_max_bytes', type: 'gauge', help: 'Maximum amount of virtual memory available in bytes.', source: 'prometheus client_golang runtime/process collectors', seenAtStartup: true },
]

/** The Go runtime's own families (go_*), which have no equivalent in a Node.js agent. */
export const isGoRuntimeMetric = (m: GoAgentMetric) => m.name.startsWith('istio_agent_go_');

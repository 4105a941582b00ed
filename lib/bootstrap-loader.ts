// Turns the user's bootstrap files into the bootstrap object: ProxyConfig.customConfigFile or a bootstrap
// template (--templateFile, proxyBootstrapTemplatePath, ISTIO_BOOTSTRAP) instead of the generated one, then the
// ISTIO_BOOTSTRAP_OVERRIDE file merged over whichever was used (Istio hands that file to Envoy's --config-yaml
// whatever the base is). File access goes through the caller's reader; every error names the file and the
// setting that pointed at it, with code CONFIG_INVALID.

import YAML from 'yaml';
import type { AgentConfig } from './config';
import type { NodeIdentity } from './node-identity';
import { buildBootstrap, localNet, mergeBootstrapOverride, runtimeFlags, xdsApiType } from './bootstrap';
import { configError, errorMessage } from './errors';

/** Returns the file's text, or undefined when it does not exist. */
export interface FileReader {
  (file: string): string | undefined;
}

export interface ResolvedBootstrap {
  bootstrap: Record<string, unknown>;
  /** Files that fed the bootstrap, to be watched for changes. */
  inputs: string[];
}

/** Which setting named a file, for error messages. */
interface FileSetting {
  field: string;
  source: string;
}

export function resolveBootstrap(cfg: AgentConfig, node: NodeIdentity, readFile: FileReader): ResolvedBootstrap {
  const inputs: string[] = [];
  let bootstrap: Record<string, unknown>;
  const custom = cfg.proxy.customConfigFile;
  if (custom) {
    // Istio runs the custom file through its template engine too, so the same placeholders work here; a file
    // without placeholders is used exactly as written.
    bootstrap = loadTemplate(custom, { field: 'customConfigFile', source: cfg.sources.customConfigFile ?? 'ProxyConfig' }, cfg, node, readFile);
    inputs.push(custom);
  } else if (cfg.templateFile) {
    bootstrap = loadTemplate(cfg.templateFile, { field: 'proxyBootstrapTemplatePath', source: cfg.sources.proxyBootstrapTemplatePath ?? '--templateFile' }, cfg, node, readFile);
    inputs.push(cfg.templateFile);
  } else {
    bootstrap = buildBootstrap({ cfg, node });
  }
  if (cfg.bootstrapOverrideFile) {
    const file = cfg.bootstrapOverrideFile;
    const setting = { field: 'ISTIO_BOOTSTRAP_OVERRIDE', source: 'environment variable ISTIO_BOOTSTRAP_OVERRIDE' };
    const parsed = parseDocument(readRequired(file, setting, readFile), file, setting, true);
    bootstrap = mergeBootstrapOverride(bootstrap, parsed);
    inputs.push(file);
  }
  return { bootstrap, inputs };
}

function readRequired(file: string, setting: FileSetting, readFile: FileReader): string {
  let text: string | undefined;
  try {
    text = readFile(file);
  } catch (e) {
    throw configError(setting.field, setting.source, `cannot read ${file}: ${errorMessage(e)}`);
  }
  if (text === undefined) throw configError(setting.field, setting.source, `file ${file} does not exist`);
  return text;
}

/** JSON or YAML (JSON is YAML); the top level must be a mapping. An empty override is allowed and changes nothing. */
function parseDocument(text: string, file: string, setting: FileSetting, emptyOk = false): Record<string, unknown> {
  let doc: unknown;
  try {
    doc = YAML.parse(text, { uniqueKeys: true });
  } catch (e) {
    throw configError(setting.field, setting.source, `${file} is not valid JSON or YAML: ${errorMessage(e).split('\n')[0]}`);
  }
  if ((doc === null || doc === undefined) && emptyOk) return {};
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) {
    throw configError(setting.field, setting.source, `${file} must hold a bootstrap mapping at the top level`);
  }
  return doc as Record<string, unknown>;
}

// ---- templates ----

/**
 * Placeholders a bootstrap template (or customConfigFile) may use, written `{{ .name }}` as in Istio's Go
 * templates (`{{-`/`-}}` trim whitespace as in Go). Go template logic (if, range, functions) cannot run here;
 * any other `{{ ... }}` is an error naming it and the file. Strings are inserted JSON-escaped without quotes,
 * so put them inside double quotes; numbers bare; `meta_json_str` and `runtime_flags` as JSON objects.
 *
 *   .nodeID                  node id, e.g. sidecar~10.1.2.3~web-1.default~default.svc.cluster.local
 *   .cluster                 node cluster (serviceCluster)
 *   .region .zone .sub_zone  node locality parts ("" when unknown)
 *   .meta_json_str           node metadata, a JSON object
 *   .runtime_flags           the static runtime layer the agent would generate, a JSON object
 *   .localhost .wildcard     127.0.0.1 and 0.0.0.0, or ::1 and :: on an IPv6-only pod
 *   .dns_lookup_family       V4_ONLY or V6_ONLY
 *   .xds_type                DELTA_GRPC or GRPC (ISTIO_DELTA_XDS)
 *   .xds_socket              the agent's xDS Unix socket (<configPath>/XDS)
 *   .sds_socket              the agent's SDS Unix socket
 *   .discovery_address       ProxyConfig.discoveryAddress
 *   .envoy_status_port       Envoy's readiness listener port (ENVOY_STATUS_PORT)
 *   .envoy_prometheus_port   Envoy's Prometheus listener port (ENVOY_PROMETHEUS_PORT)
 *   .outlier_log_path        --outlierLogPath ("" when unset)
 *   .config.ProxyAdminPort .config.StatusPort .config.ConfigPath .config.BinaryPath
 *   .config.DiscoveryAddress .config.ServiceCluster    the ProxyConfig fields of those names
 */
type TemplateValue = string | number | Record<string, unknown>;

function templateValues(cfg: AgentConfig, node: NodeIdentity): Record<string, TemplateValue> {
  const net = localNet(node);
  const p = cfg.proxy;
  return {
    nodeID: node.id,
    cluster: node.cluster,
    region: node.locality.region ?? '',
    zone: node.locality.zone ?? '',
    sub_zone: node.locality.sub_zone ?? '',
    meta_json_str: node.metadata,
    runtime_flags: runtimeFlags(cfg),
    localhost: net.localhost,
    wildcard: net.wildcard,
    dns_lookup_family: net.dnsLookupFamily,
    xds_type: xdsApiType(cfg),
    xds_socket: cfg.xdsSocket,
    sds_socket: cfg.sdsSocket,
    discovery_address: p.discoveryAddress,
    envoy_status_port: cfg.envoyStatusPort,
    envoy_prometheus_port: cfg.envoyPrometheusPort,
    outlier_log_path: cfg.outlierLogPath,
    'config.ProxyAdminPort': p.proxyAdminPort,
    'config.StatusPort': p.statusPort,
    'config.ConfigPath': p.configPath,
    'config.BinaryPath': p.binaryPath,
    'config.DiscoveryAddress': p.discoveryAddress,
    'config.ServiceCluster': p.serviceCluster,
  };
}

const PLACEHOLDER = /([ \t\r\n]*)\{\{(-?)\s*(.*?)\s*(-?)\}\}([ \t\r\n]*)/g;

function renderValue(v: TemplateValue): string {
  if (typeof v === 'number') return String(v);
  if (typeof v === 'string') return JSON.stringify(v).slice(1, -1);
  return JSON.stringify(v);
}

const lineOf = (text: string, index: number) => text.slice(0, index).split('\n').length;

/** Substitutes the supported placeholders; throws naming every unsupported one with its line. */
export function renderTemplate(text: string, file: string, setting: FileSetting, values: Record<string, TemplateValue>): string {
  const unknown: string[] = [];
  const out = text.replace(PLACEHOLDER, (whole: string, before: string, trimLeft: string, expr: string, trimRight: string, after: string, offset: number) => {
    const name = /^\.([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)?)$/.exec(expr)?.[1];
    if (name === undefined || !(name in values)) {
      const line = lineOf(text, offset + before.length);
      unknown.push(`"${whole.trim()}" (line ${line})`);
      return whole;
    }
    return `${trimLeft ? '' : before}${renderValue(values[name]!)}${trimRight ? '' : after}`;
  });
  if (unknown.length > 0) {
    const supported = Object.keys(values).map((k) => `.${k}`).join(', ');
    throw configError(setting.field, setting.source, `${file} uses unsupported template placeholder ${unknown.join(', ')}; supported: ${supported}`);
  }
  const stray = text.replace(PLACEHOLDER, '').indexOf('{{');
  if (stray >= 0) throw configError(setting.field, setting.source, `${file} has an unterminated "{{" placeholder`);
  return out;
}

function loadTemplate(file: string, setting: FileSetting, cfg: AgentConfig, node: NodeIdentity, readFile: FileReader): Record<string, unknown> {
  const text = readRequired(file, setting, readFile);
  return parseDocument(renderTemplate(text, file, setting, templateValues(cfg, node)), file, setting);
}

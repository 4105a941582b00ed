// Turns the user's bootstrap files into the bootstrap object: ProxyConfig.customConfigFile or a bootstrap
// template (--templateFile, proxyBootstrapTemplatePath, ISTIO_BOOTSTRAP) instead of the generated one, then the
// ISTIO_BOOTSTRAP_OVERRIDE file merged over whichever was used (Istio hands that file to Envoy's --config-yaml
// whatever the base is). File access goes through the caller's reader; every error names the file and the
// setting that pointed at it, with code CONFIG_INVALID.

import type { AgentConfig } from './config';
import type { NodeIdentity } from './node-identity';
import { adminOnSocket, buildBootstrap, hardenPublicListeners, mergeBootstrapOverride } from './bootstrap';
import { templateVariables } from './bootstrap-template';
import { renderGoTemplate, TemplateError } from './go-template';
import { configError, errorMessage } from './errors';
import { parseJsonOrYaml } from './json-or-yaml';

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
    // Used as written, as Istio hands it to Envoy without rendering it.
    const setting = { field: 'customConfigFile', source: cfg.sources.customConfigFile ?? 'ProxyConfig' };
    bootstrap = parseDocument(readRequired(custom, setting, readFile), custom, setting);
    inputs.push(custom);
  } else if (cfg.templateFile) {
    const setting = cfg.sources.ISTIO_BOOTSTRAP
      ? { field: 'ISTIO_BOOTSTRAP', source: cfg.sources.ISTIO_BOOTSTRAP }
      : cfg.sources.defaultTemplate
        ? { field: 'bootstrap template', source: cfg.sources.defaultTemplate }
        : { field: 'proxyBootstrapTemplatePath', source: cfg.sources.proxyBootstrapTemplatePath ?? '--templateFile' };
    bootstrap = hardenPublicListeners(loadTemplate(cfg.templateFile, setting, cfg, node, readFile), [
      cfg.envoyPrometheusPort,
      cfg.envoyStatusPort,
    ]);
    inputs.push(cfg.templateFile);
  } else {
    bootstrap = buildBootstrap({ cfg, node });
  }
  if (cfg.bootstrapOverrideFile) {
    const file = cfg.bootstrapOverrideFile;
    const setting = { field: 'ISTIO_BOOTSTRAP_OVERRIDE', source: 'environment variable ISTIO_BOOTSTRAP_OVERRIDE' };
    const parsed = parseDocument(expandHostIp(readRequired(file, setting, readFile), cfg.hostIp), file, setting, true);
    bootstrap = mergeBootstrapOverride(bootstrap, parsed);
    inputs.push(file);
  }
  // Last, so that neither a template nor an override brings the admin back onto TCP.
  if (cfg.envoyAdminSocket) bootstrap = adminOnSocket(bootstrap, cfg.envoyAdminSocket);
  return { bootstrap, inputs };
}

/**
 * `$(HOST_IP)` in the override's text becomes HOST_IP, as Istio's readBootstrapToJSON does it (node-local tracing
 * agents: `address: $(HOST_IP):8126`): an IPv6 HOST_IP is bracketed, and `[$(HOST_IP)]` written for one is not
 * bracketed twice. Unset, the placeholder becomes empty, as in Istio.
 */
export function expandHostIp(text: string, hostIp: string): string {
  // Replacer functions: a `$` in HOST_IP is not a replacement pattern.
  if (!hostIp.includes(':')) return text.replaceAll('$(HOST_IP)', () => hostIp);
  const bracketed = `[${hostIp}]`;
  return text.replaceAll('[$(HOST_IP)]', () => bracketed).replaceAll('$(HOST_IP)', () => bracketed);
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
    doc = parseJsonOrYaml(text);
  } catch (e) {
    throw configError(
      setting.field,
      setting.source,
      `${file} is not valid JSON or YAML: ${errorMessage(e).split('\n')[0]}`,
    );
  }
  if ((doc === null || doc === undefined) && emptyOk) return {};
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) {
    throw configError(setting.field, setting.source, `${file} must hold a bootstrap mapping at the top level`);
  }
  return doc as Record<string, unknown>;
}

// ---- templates ----

/**
 * A bootstrap template is a Go text/template, as Istio's (lib/go-template.ts renders the subset such templates
 * use), over the variables the Go agent passes (lib/bootstrap-template.ts). The result is parsed as JSON or YAML.
 */
function loadTemplate(
  file: string,
  setting: FileSetting,
  cfg: AgentConfig,
  node: NodeIdentity,
  readFile: FileReader,
): Record<string, unknown> {
  const text = readRequired(file, setting, readFile);
  let rendered: string;
  try {
    rendered = renderGoTemplate(text, templateVariables(cfg, node));
  } catch (e) {
    if (e instanceof TemplateError) throw configError(setting.field, setting.source, `template ${file}: ${e.message}`);
    throw e;
  }
  return parseDocument(rendered, file, setting);
}

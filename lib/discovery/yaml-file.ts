// One config file (multi-document YAML, or JSON) -> validated configs, or issues that name the file, the document,
// the field and its line. A file is all-or-nothing: one bad document rejects the whole file.
// Issues go to the log, and a file in the directory may be anything (a key or /etc/shadow symlinked in): a
// document that does not name a supported kind is reported as not a config, without a word of its text, and
// parser messages lose the text they quote. Only a document that is a config gets its values quoted.

import * as YAML from 'yaml';
import { yamlErrorText } from '../json-or-yaml';
import { readDocument } from './kinds';
import { type Config, KINDS } from './model';
import { formatPath, type Path } from './schema';

export interface ConfigIssue {
  file: string;
  /** 1-based document index, when the problem is inside one. */
  doc?: number;
  /** `Kind namespace/name`, when known. */
  subject?: string;
  field?: string;
  line?: number;
  col?: number;
  message: string;
}

export function formatIssue(i: ConfigIssue): string {
  let s = i.file;
  if (i.line !== undefined) s += `:${i.line}:${i.col ?? 1}`;
  if (i.doc !== undefined) s += `: document ${i.doc}`;
  if (i.subject) s += ` (${i.subject})`;
  if (i.field) s += `: field ${i.field}`;
  return `${s}: ${i.message}`;
}

export interface FileResult {
  configs: Config[];
  issues: ConfigIssue[];
}

export interface ParseLimits {
  /** Documents in one file; parsing stops at the first one beyond (default DEFAULT_MAX_DOCUMENTS). */
  maxDocuments?: number;
}

export const DEFAULT_MAX_DOCUMENTS = 10_000;

export function parseConfigFile(file: string, text: string, limits: ParseLimits = {}): FileResult {
  const out: FileResult = { configs: [], issues: [] };
  for (const _ of parseSteps(file, text, limits, out));
  return out;
}

/**
 * The same, giving the event loop back every `sliceMs` of work, so that the status and discovery servers keep
 * answering while a large file loads. The parser is incremental: one document is tokenised and read at a time.
 */
export async function parseConfigFileAsync(
  file: string,
  text: string,
  limits: ParseLimits = {},
  sliceMs = 10,
): Promise<FileResult> {
  const out: FileResult = { configs: [], issues: [] };
  let sliceStart = performance.now();
  for (const _ of parseSteps(file, text, limits, out)) {
    if (performance.now() - sliceStart >= sliceMs) {
      await new Promise<void>((r) => setImmediate(r));
      sliceStart = performance.now();
    }
  }
  return out;
}

/** Parses one document per step into `out`. A file is all-or-nothing, so the caller discards configs on issues. */
function* parseSteps(file: string, text: string, limits: ParseLimits, out: FileResult): Generator<void> {
  const maxDocuments = limits.maxDocuments ?? DEFAULT_MAX_DOCUMENTS;
  const lineCounter = new YAML.LineCounter();
  const parser = new YAML.Parser(lineCounter.addNewLine);
  const composer = new YAML.Composer({ uniqueKeys: true, prettyErrors: false });
  const { issues, configs } = out;
  const locate = lazyLocator(text);
  let docNo = 0;
  // An empty file is an empty stream: no document at all.
  for (const doc of composer.compose(parser.parse(text))) {
    docNo++;
    if (docNo > maxDocuments) {
      issues.push({
        file,
        message: `has more than ${maxDocuments} documents (DISCOVERY_MAX_DOCUMENTS); split it into several files or raise the limit`,
      });
      return;
    }
    readOne(doc, docNo);
    yield;
  }

  function readOne(doc: YAML.Document.Parsed, docNo: number): void {
    if (doc.errors.length) {
      for (const e of doc.errors) {
        issues.push({
          file,
          doc: docNo,
          message: `invalid YAML: ${yamlErrorText(e.message)}`,
          ...pos(lineCounter, e.pos[0]),
        });
      }
      return;
    }
    if (doc.contents === null) return; // an empty document, e.g. after a trailing `---`
    let js: unknown;
    try {
      js = doc.toJS({ maxAliasCount: 100 });
    } catch (e) {
      issues.push({ file, doc: docNo, message: `invalid YAML: ${yamlErrorText((e as Error).message)}` });
      return;
    }
    if (js === null || js === undefined) return; // `---` followed by nothing, or only comments
    const notConfig = notAConfig(js);
    if (notConfig) {
      issues.push({ file, doc: docNo, ...notConfig, ...pos(lineCounter, rangeStart(doc.contents)) });
      return;
    }
    const { config, problems } = readDocument(js);
    const subject = subjectOf(js);
    for (const p of problems) {
      const issue: ConfigIssue = { file, doc: docNo, message: p.message, ...pos(lineCounter, offsetOf(doc, p.path)) };
      if (subject) issue.subject = subject;
      if (p.path.length) issue.field = formatPath(p.path);
      issues.push(issue);
    }
    if (config) {
      // Not the parsed document itself: kept alive by every config, the parse trees of a 4 MB file took 300 MB.
      config.meta.source = { file, doc: docNo, locate: (path) => locate(docNo, path) };
      configs.push(config);
    }
  }
}

/**
 * Positions for the cross checks, which run after parsing: the file is parsed again the first time one is asked
 * for, and that copy is dropped once the current task ends (all of one check's issues are located in one task).
 */
function lazyLocator(text: string): (docNo: number, path: Path) => { line?: number; col?: number } {
  let cache: { lc: YAML.LineCounter; docs: YAML.Document.Parsed[] } | undefined;
  return (docNo, path) => {
    if (!cache) {
      const lc = new YAML.LineCounter();
      const docs = YAML.parseAllDocuments(text, { lineCounter: lc, uniqueKeys: true, prettyErrors: false });
      cache = { lc, docs: Array.isArray(docs) ? docs : [] };
      setImmediate(() => (cache = undefined));
    }
    const doc = cache.docs[docNo - 1];
    return doc ? pos(cache.lc, offsetOf(doc, path)) : {};
  };
}

const KIND_NAME = /^[A-Z][A-Za-z0-9]{0,62}$/;

/**
 * Why a document is not a config, in words that quote nothing of it (its kind only when that is a plain kind
 * name); undefined for a mapping that names a supported kind, whose problems the kind's reader reports.
 */
function notAConfig(js: unknown): { field?: string; message: string } | undefined {
  const supported = `supported: ${KINDS.join(', ')}`;
  if (typeof js !== 'object' || js === null || Array.isArray(js)) {
    const what = Array.isArray(js)
      ? 'a list'
      : typeof js === 'string'
        ? `a string (${js.length} characters)`
        : `a ${typeof js}`;
    return { message: `is not a config: must be a mapping with apiVersion and kind, not ${what}` };
  }
  const kind = (js as { kind?: unknown }).kind;
  if (kind === undefined || kind === null) {
    return { field: 'kind', message: `is required; without it the document is not read further (${supported})` };
  }
  if (typeof kind !== 'string') return { field: 'kind', message: `must be a kind name (${supported})` };
  if (!(KINDS as readonly string[]).includes(kind)) {
    const named = KIND_NAME.test(kind) ? ` "${kind}"` : '';
    return { field: 'kind', message: `unknown or unsupported kind${named} (${supported})` };
  }
  return undefined;
}

const short = (s: string) => (s.length > 100 ? `${s.slice(0, 100)}...` : s);

function subjectOf(js: unknown): string | undefined {
  if (!js || typeof js !== 'object') return undefined;
  const o = js as { kind?: unknown; metadata?: { name?: unknown; namespace?: unknown } };
  if (typeof o.kind !== 'string' || typeof o.metadata?.name !== 'string') return undefined;
  const ns = typeof o.metadata.namespace === 'string' ? o.metadata.namespace : 'default';
  return `${short(o.kind)} ${short(ns)}/${short(o.metadata.name)}`;
}

/** Offset of the deepest node on `path` that exists (a missing field points at its parent). */
function offsetOf(doc: YAML.Document, path: Path): number | undefined {
  let node: unknown = doc.contents;
  let offset = rangeStart(node);
  for (let i = 0; i < path.length; i++) {
    const key = path[i];
    if (YAML.isMap(node)) {
      const pair = node.items.find((p) => (YAML.isScalar(p.key) ? p.key.value : p.key) === key);
      if (!pair) break;
      // Point at the key: that is where an editor shows the field.
      offset = rangeStart(pair.key) ?? offset;
      node = pair.value;
      if (i === path.length - 1) break;
      offset = rangeStart(node) ?? offset;
    } else if (YAML.isSeq(node) && typeof key === 'number') {
      node = node.items[key];
      if (node === undefined) break;
      offset = rangeStart(node) ?? offset;
    } else break;
  }
  return offset;
}

function rangeStart(node: unknown): number | undefined {
  const r = (node as { range?: [number, number, number] } | null | undefined)?.range;
  return r ? r[0] : undefined;
}

function pos(lc: YAML.LineCounter, offset: number | undefined): { line?: number; col?: number } {
  if (offset === undefined) return {};
  const p = lc.linePos(offset);
  return { line: p.line, col: p.col };
}

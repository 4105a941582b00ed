// One config file (multi-document YAML, or JSON) -> validated configs, or issues that name the file, the document,
// the field and its line. A file is all-or-nothing: one bad document rejects the whole file.

import * as YAML from 'yaml';
import { readDocument } from './kinds';
import type { Config } from './model';
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

export function parseConfigFile(file: string, text: string): FileResult {
  const lineCounter = new YAML.LineCounter();
  const docs = YAML.parseAllDocuments(text, { lineCounter, uniqueKeys: true, prettyErrors: false });
  const issues: ConfigIssue[] = [];
  const configs: Config[] = [];
  // An empty file is an EmptyStream: an empty array.
  docs.forEach((doc, i) => {
    const docNo = i + 1;
    if (doc.errors.length) {
      for (const e of doc.errors) issues.push({ file, doc: docNo, message: `invalid YAML: ${firstLine(e.message)}`, ...pos(lineCounter, e.pos[0]) });
      return;
    }
    if (doc.contents === null) return; // an empty document, e.g. after a trailing `---`
    let js: unknown;
    try {
      js = doc.toJS({ maxAliasCount: 100 });
    } catch (e) {
      issues.push({ file, doc: docNo, message: `invalid YAML: ${(e as Error).message}` });
      return;
    }
    if (js === null || js === undefined) return; // `---` followed by nothing, or only comments
    const { config, problems } = readDocument(js);
    const subject = subjectOf(js);
    for (const p of problems) {
      const issue: ConfigIssue = { file, doc: docNo, message: p.message, ...pos(lineCounter, offsetOf(doc, p.path)) };
      if (subject) issue.subject = subject;
      if (p.path.length) issue.field = formatPath(p.path);
      issues.push(issue);
    }
    if (config) {
      config.meta.source = { file, doc: docNo, locate: (path) => pos(lineCounter, offsetOf(doc, path)) };
      configs.push(config);
    }
  });
  return { configs, issues };
}

function firstLine(s: string): string {
  return s.split('\n')[0]!;
}

function subjectOf(js: unknown): string | undefined {
  if (!js || typeof js !== 'object') return undefined;
  const o = js as { kind?: unknown; metadata?: { name?: unknown; namespace?: unknown } };
  if (typeof o.kind !== 'string' || typeof o.metadata?.name !== 'string') return undefined;
  const ns = typeof o.metadata.namespace === 'string' ? o.metadata.namespace : 'default';
  return `${o.kind} ${ns}/${o.metadata.name}`;
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

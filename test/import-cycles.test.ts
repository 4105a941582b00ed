// Layers import downward only: no module of lib/ or agent.ts reaches itself again through its imports (type-only
// imports count too, as `madge --circular` counts them: a cycle of types is still two files that cannot be read
// apart). Dynamic `import()`s are left out: they are how start-up defers a module, not a layer's dependency.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { REPO } from './helpers/harness';

function sources(): string[] {
  const out = [path.join(REPO, 'agent.ts')];
  const walk = (dir: string) => {
    for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
      const p = path.join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.ts')) out.push(p);
    }
  };
  walk(path.join(REPO, 'lib'));
  return out;
}

/** Static imports and re-exports of relative modules, resolved to files. */
function importsOf(file: string): string[] {
  const text = fs.readFileSync(file, 'utf8');
  const found: string[] = [];
  const re = /^\s*(?:import|export)\s(?:[^'";]*?\sfrom\s)?['"](\.{1,2}\/[^'"]+)['"]/gm;
  for (const m of text.matchAll(re)) {
    const base = path.resolve(path.dirname(file), m[1]!);
    const hit = [`${base}.ts`, path.join(base, 'index.ts')].find((f) => fs.existsSync(f));
    if (hit) found.push(hit);
  }
  return found;
}

export function findCycles(files: string[]): string[][] {
  const graph = new Map(files.map((f) => [f, importsOf(f)]));
  const cycles: string[][] = [];
  const state = new Map<string, 'open' | 'done'>();
  const stack: string[] = [];
  const visit = (f: string) => {
    state.set(f, 'open');
    stack.push(f);
    for (const g of graph.get(f) ?? []) {
      if (state.get(g) === 'open') cycles.push([...stack.slice(stack.indexOf(g)), g]);
      else if (!state.has(g)) visit(g);
    }
    stack.pop();
    state.set(f, 'done');
  };
  for (const f of files) if (!state.has(f)) visit(f);
  return cycles;
}

test('the checker finds a cycle when there is one', () => {
  const dir = fs.mkdtempSync(path.join(REPO, 'test', '.tmp-cycles-'));
  try {
    fs.writeFileSync(path.join(dir, 'a.ts'), "import type { B } from './b';\nexport type A = B;\n");
    fs.writeFileSync(path.join(dir, 'b.ts'), "import { c } from './c';\nexport type B = number;\nexport const b = c;\n");
    fs.writeFileSync(path.join(dir, 'c.ts'), "export { a } from './a';\nexport const c = 1;\nconst later = () => import('./b');\n");
    const cycles = findCycles(['a.ts', 'b.ts', 'c.ts'].map((f) => path.join(dir, f)));
    assert.is(cycles.length, 1);
    assert.equal(cycles[0]!.map((f) => path.basename(f)), ['a.ts', 'b.ts', 'c.ts', 'a.ts']);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('no import cycle in lib/ and agent.ts', () => {
  const cycles = findCycles(sources()).map((c) => c.map((f) => path.relative(REPO, f)).join(' -> '));
  assert.equal(cycles, [], `import cycles:\n${cycles.join('\n')}`);
});

test.run();

// JSON inputs are read without the YAML parser, with the same answers and errors as YAML gives them.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { parseJsonOrYaml } from '../lib/json-or-yaml';

test('JSON and YAML give the same values', () => {
  const json = '{"a": {"b": [1, {"c": "x\\"y"}], "d": null}, "e": "\\u00e9"}';
  assert.equal(parseJsonOrYaml(json), { a: { b: [1, { c: 'x"y' }], d: null }, e: 'é' });
  assert.equal(parseJsonOrYaml('a:\n  b: [1, 2]\n'), { a: { b: [1, 2] } });
  assert.equal(parseJsonOrYaml('{a: 1}'), { a: 1 }, 'a YAML flow mapping that is not JSON');
});

test('a key given twice is refused in JSON as in YAML, at any depth and however it is spelled', () => {
  for (const text of ['{"a": 1, "a": 2}', '{"x": {"a": 1, "b": [{"a": 1}], "a": 2}}', '{"a": 1, "\\u0061": 2}', '[{"k": 1}, {"k": 2, "k": 3}]']) {
    assert.throws(() => parseJsonOrYaml(text), /Map keys must be unique/, text);
  }
  // The same key in sibling objects, or as a value, is not a duplicate.
  assert.equal(parseJsonOrYaml('[{"k": 1}, {"k": 2}]'), [{ k: 1 }, { k: 2 }]);
  assert.equal(parseJsonOrYaml('{"a": "a", "b": {"a": 1}}'), { a: 'a', b: { a: 1 } });
});

test('invalid text is explained by the YAML parser', () => {
  assert.throws(() => parseJsonOrYaml('{"a": [1}'), (e: Error) => e.name.startsWith('YAML'));
});

test('YAML errors say what and where, never the text (a key may have been given as the file)', () => {
  const cases: Array<[string, RegExp]> = [
    ['token: *s3cr3t-alias-value\n', /^Unresolved alias \(the anchor must be set before the alias\)$/],
    ['key: |s3cr3t-header-value\n  x\n', /^Block scalar header includes extra characters at line 1, column 7$/],
    ['a: "s3cr3t \\q"\n', /^Invalid escape sequence \\q at line 1, column 12$/],
    ['a: b\n  c: "s3cr3t-value\n', /at line 1, column 4$/],
  ];
  for (const [text, want] of cases) {
    assert.throws(() => parseJsonOrYaml(text), (e: Error) => want.test(e.message) && !/s3cr3t/.test(e.message), text);
  }
});

test.run();

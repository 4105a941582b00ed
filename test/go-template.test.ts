// lib/go-template.ts against the behaviour of Go's text/template (and sprig) for the constructs bootstrap
// templates use. Expected outputs are what Go prints for the same template and data.

import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { GO_NIL, goStruct, renderGoTemplate, TemplateError } from '../lib/go-template';

const DATA = {
  a: 'x',
  n: 3,
  f: 0.5,
  l: ['p', 'q'],
  m: { k: 'v', z: 1 },
  e: '',
  zero: 0,
  nilMap: GO_NIL,
  cfg: goStruct('*model.NodeMetaProxyConfig', { ProxyAdminPort: 15000, ProxyMetadata: GO_NIL }),
};
const r = (src: string, data: unknown = DATA) => renderGoTemplate(src, data);

test('trim markers eat whitespace and newlines on their side only; comments print nothing', () => {
  assert.is(r('a  {{- .a -}}\n  b'), 'axb');
  assert.is(r('a {{ .a }} b'), 'a x b');
  assert.is(r('a\n{{- /* note */ -}}\nb {{/* c */}}c'), 'ab c');
  assert.is(r('{{-3}}'), '-3', '"{{-" without a space is a negative number, not a trim marker');
});

test('if / else if / else, with truthiness as Go: empty string, 0, nil, empty map/list and missing keys are false', () => {
  const t = '{{ if .missing }}1{{ else if .e }}2{{ else if .zero }}3{{ else if .nilMap }}4{{ else if .l }}5{{ end }}';
  assert.is(r(t), '5');
  assert.is(r('{{ if .a }}yes{{ else }}no{{ end }}'), 'yes');
  assert.is(r('{{ if or .region .zone }},{{ end }}'), '');
  assert.is(r('{{ if and .a .n }}{{ .n }}{{ end }}'), '3');
});

test('range over lists and maps (sorted keys), with $i, $v, else, break and continue', () => {
  assert.is(r('{{ range $i, $v := .l }}{{ $i }}={{ $v }},{{ end }}'), '0=p,1=q,');
  assert.is(r('{{ range .l }}[{{ . }}]{{ end }}'), '[p][q]');
  assert.is(r('{{ range $k, $v := .m }}{{ $k }}:{{ $v }} {{ end }}'), 'k:v z:1 ');
  assert.is(r('{{ range .nothing }}x{{ else }}empty{{ end }}'), 'empty');
  assert.is(r('{{ range .l }}{{ if eq . "p" }}{{ continue }}{{ end }}{{ . }}{{ end }}'), 'q');
  assert.is(r('{{ range .l }}{{ . }}{{ break }}{{ end }}'), 'p');
});

test('with sets dot; else with chains; variables are scoped to their block and can be reassigned', () => {
  assert.is(r('{{ with .m }}{{ .k }}{{ end }}{{ with .missing }}x{{ else with .a }}{{ . }}{{ end }}'), 'vx');
  assert.is(r('{{ $x := .a }}{{ $x }}{{ $x = "y" }}{{ $x }}{{ if true }}{{ $x := "in" }}{{ $x }}{{ end }}{{ $x }}'), 'xyiny');
  assert.is(r('{{ range .l }}{{ $.a }}{{ end }}'), 'xx', '$ is the root');
});

test('values print as Go prints them: <no value> for a missing key, map[k:v], [a b], numbers', () => {
  assert.is(r('{{ .missing }}|{{ .m }}|{{ .l }}|{{ .n }}|{{ .f }}|{{ .nilMap }}'), '<no value>|map[k:v z:1]|[p q]|3|0.5|map[]');
  assert.is(r('{{ .cfg.ProxyAdminPort }}'), '15000');
});

test('a missing field of a struct is an error naming the field and type, with the line', () => {
  try {
    r('\n{{ .cfg.NoSuch }}');
    assert.unreachable();
  } catch (e) {
    assert.instance(e, TemplateError);
    assert.match((e as Error).message, /line 2: can't evaluate field NoSuch in type \*model\.NodeMetaProxyConfig/);
  }
});

test('pipelines pass the value as the last argument; parentheses group; fields of a parenthesised value', () => {
  assert.is(r('{{ .a | printf "<%s>" }}'), '<x>');
  assert.is(r('{{ printf "%s-%d-%q-%v-%t-%5.2f-%%" .a .n .a .l true .f }}'), 'x-3-"x"-[p q]-true- 0.50-%');
  assert.is(r('{{ (index .l 1) }}{{ (.m).k }}{{ len .l }}{{ index .m "k" }}'), 'qv2v');
  assert.is(r('{{ .e | default "d" }}{{ default "d" .a }}{{ "A" | lower }}{{ upper "b" }}'), 'dxaB');
});

test('comparison and logic: eq with several candidates, ne, lt, and/or return the deciding value', () => {
  assert.is(r('{{ eq .a "y" "x" }} {{ ne .n 3 }} {{ lt .n 4 }} {{ ge .n 3 }} {{ not .e }}'), 'true false true true true');
  assert.is(r('{{ and .a .e }}|{{ or .e .n }}|{{ or .e .zero }}'), '|3|0');
});

test('JSON helpers: Istio\'s toJSON ("{}" for nil), sprig\'s toJson; a nil map field is null', () => {
  assert.is(r('{{ toJSON .m }} {{ toJson .l }} {{ toJSON nil }} {{ toJSON .cfg.ProxyMetadata }} {{ toJson .missing }}'), '{"k":"v","z":1} ["p","q"] {} null null');
});

test('js escapes like Go (Istio uses it for stats regexes inside JSON strings)', () => {
  assert.is(r('{{ js "vhost\\\\..*\\\\.route=<a&b>\'\\"" }}'), 'vhost\\\\..*\\\\.route\\u003D\\u003Ca\\u0026b\\u003E\\\'\\"');
});

test('strings: Go escapes in "..." and none in raw `...`; actions may contain }} inside strings', () => {
  assert.is(r('{{ "a\\tb\\u00e9" }}|{{ `a\\tb` }}|{{ "}}" }}'), 'a\tbé|a\\tb|}}');
});

test('sprig list helpers and arithmetic', () => {
  assert.is(r('{{ join "," .l }} {{ list 1 2 | len }} {{ (dict "a" 1).a }} {{ hasKey .m "k" }} {{ add1 .n }} {{ add 1 2 3 }} {{ quote .a }}'), 'p,q 2 1 true 4 6 "x"');
});

test('unsupported and malformed templates fail with the line', () => {
  assert.throws(() => r('{{ define "x" }}{{ end }}'), /line 1: \{\{define\}\} is not supported/);
  assert.throws(() => r('x\n{{ if .a }}'), /line 2: if has no \{\{end\}\}/);
  assert.throws(() => r('{{ .a'), /unclosed action/);
  assert.throws(() => r('{{ nosuch 1 }}'), /function "nosuch" not defined/);
  assert.throws(() => r('{{ $nope }}'), /undefined variable "\$nope"/);
});

test.run();

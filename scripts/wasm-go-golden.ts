// Regenerates test/golden/wasm-go-convert.json: what the Go agent's own pkg/wasm.MaybeConvertWasmExtensionConfig
// makes of a set of istiod-style ECDS Wasm resources, once with a cache that fails (Go's allow-all / deny-all RBAC
// stand-ins) and once with one that returns a local file. The Go program below is built offline from the Go
// module cache (the istio module the Go agent was built from); test/wasm-cache.test.ts compares this agent's
// conversion with the golden, so the suite needs no Go.
//   npx tsx scripts/wasm-go-golden.ts

import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { WASM_GOLDEN_CASES, WASM_GOLDEN_FILE, wasmGoldenInput } from '../test/helpers/wasm-module';

const ISTIO = '/root/go/pkg/mod/istio.io/istio@v0.0.0-20260827124520-eed52ebb66ad';

const MAIN_GO = `// Go's own conversion of ECDS resources, for a parity check: reads Any bytes (hex, one per line) on stdin,
// runs pkg/wasm.MaybeConvertWasmExtensionConfig with a cache that always fails, prints the result Any as hex.
package main

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"google.golang.org/protobuf/proto"
	anypb "google.golang.org/protobuf/types/known/anypb"

	"istio.io/istio/pkg/wasm"
)

type failing struct{ path string }

func (f failing) Get(url string, opts wasm.GetOptions) (string, error) {
	if f.path != "" {
		return f.path, nil
	}
	return "", errors.New("fetch failed")
}
func (failing) Cleanup() {}

func main() {
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	path := ""
	if len(os.Args) > 1 {
		path = os.Args[1]
	}
	for sc.Scan() {
		b, _ := hex.DecodeString(sc.Text())
		a := &anypb.Any{}
		if err := proto.Unmarshal(b, a); err != nil {
			panic(err)
		}
		res := []*anypb.Any{a}
		if err := wasm.MaybeConvertWasmExtensionConfig(res, failing{path}); err != nil {
			fmt.Println("ERR", err)
			continue
		}
		out, _ := proto.MarshalOptions{Deterministic: true}.Marshal(res[0])
		fmt.Println(hex.EncodeToString(out))
	}
}
`;

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'wasm-go-golden-'));
try {
  fs.writeFileSync(path.join(dir, 'main.go'), MAIN_GO);
  const version = path.basename(ISTIO).split('@')[1];
  fs.writeFileSync(path.join(dir, 'go.mod'), `module wasmgolden\n\ngo 1.26\n\nrequire istio.io/istio ${version}\n\nreplace istio.io/istio => ${ISTIO}\n`);
  const env = {
    ...process.env, GOPROXY: 'file:///root/go/pkg/mod/cache/download', GOSUMDB: 'off', GOTOOLCHAIN: 'local', GOFLAGS: '-mod=mod',
  };
  try {
    execFileSync('go', ['mod', 'tidy', '-e'], { cwd: dir, env, stdio: 'ignore' });
  } catch {
    // test-only dependencies missing from the cache; the build below needs none of them
  }
  execFileSync('go', ['build', '-o', 'convert', '.'], { cwd: dir, env, stdio: 'inherit' });
  const input = wasmGoldenInput().map((a) => a.toString('hex')).join('\n') + '\n';
  const run = (args: string[]) => execFileSync(path.join(dir, 'convert'), args, { input }).toString()
    .split('\n').filter((l) => /^([0-9a-f]+|ERR .*)$/.test(l));
  const golden = {
    source: `${path.basename(ISTIO)} pkg/wasm.MaybeConvertWasmExtensionConfig`,
    localFile: WASM_GOLDEN_CASES.localFile,
    cases: WASM_GOLDEN_CASES.names,
    fetchFails: run([]),
    fetchGives: run([WASM_GOLDEN_CASES.localFile]),
  };
  fs.writeFileSync(WASM_GOLDEN_FILE, JSON.stringify(golden, null, 2) + '\n');
  console.log(`wrote ${WASM_GOLDEN_FILE}`);
} finally {
  fs.rmSync(dir, { recursive: true, force: true });
}

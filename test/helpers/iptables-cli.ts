// `pilot-agent istio-iptables ARGS` as its own process, for tests that must run it as another user or inside
// a namespace (the validation probe uses the current process's network namespace and uid).
import { runIstioCleanIptables, runIstioIptables } from '../../lib/iptables-command';

const [command, ...args] = process.argv.slice(2);
(command === 'istio-clean-iptables' ? runIstioCleanIptables(args) : runIstioIptables(args)).then((code) => process.exit(code));

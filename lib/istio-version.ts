// The Istio version this agent reports to istiod when ISTIO_VERSION is not set (VMs, or anything started without
// the injector's variables). istiod gates features on the proxy's version (model.ParseIstioVersion: "1.32-dev" is
// 1.32 with any patch), so the agent's own package version (0.1.0) made it treat every such proxy as Istio 0.1
// and hold back tracing, listener and policy features. The value is what the Go agent it reproduces reports:
// istio/istio master at v0.0.0-20260827124520-eed52ebb66ad, whose VERSION file says 1.32, built by Istio's
// Makefile as "1.32-dev". Raise it when the agent catches up with a newer Go agent, not before.

export const ISTIO_VERSION_IMPLEMENTED = '1.32-dev';

"""goodput-mixin: everything generated from one settings model, as kubernetes-mixin does it: the Prometheus
recording and alerting rules, the Grafana dashboards, the Helm chart's generated files and the plain manifests,
the metrics and configuration references, and the demo. A build and test tool: never imported by the runtime,
never in the container image."""

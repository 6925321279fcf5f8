// Package deploy holds no code: its directory carries the deployment
// artefacts (Prometheus alert rules, the Grafana dashboard, Kubernetes
// manifests), and its test checks them, with the repository's compose.yaml
// and Dockerfile, against the Compose Specification's JSON schema and against
// the code: every metric a rule or panel names exists, every alert has a
// runbook entry, every configuration variable a manifest sets is one the
// coordinator reads.
package deploy

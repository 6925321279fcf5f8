// Package deploy holds no code: its directory carries the deployment
// artefacts (Prometheus alert rules, the Grafana dashboard, Kubernetes
// manifests), and its test checks them, with the repository's compose.yaml
// and Dockerfile, against the Compose Specification's JSON schema and against
// the code: every metric a rule or panel names exists, every alert has a
// runbook entry, every configuration variable a manifest sets is one the
// coordinator reads. With promtool (scripts/services install promtool) it
// runs the alert rules' tests and checks a live scrape of `coordinator
// serve`: promtool check metrics passes, and every series a rule selects is
// there from the start.
package deploy

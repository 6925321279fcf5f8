package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/schema"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/cronspec"
	"github.com/telco-platform/coordinator/internal/events"
)

// root is the repository root, relative to this package's directory.
const root = ".."

func readFile(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	require.NoError(t, err)
	return b
}

// yamlDocs decodes every document of a YAML stream into generic maps.
func yamlDocs(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var docs []map[string]any
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return docs
		}
		require.NoError(t, err)
		if d != nil {
			docs = append(docs, d)
		}
	}
}

// configVariables returns every COORDINATOR_* variable the coordinator reads,
// taken from the configuration flags' usage strings ("... ($COORDINATOR_X)").
func configVariables(t *testing.T) map[string]bool {
	t.Helper()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	config.Bind(fs, func(string) string { return "" })
	re := regexp.MustCompile(`\$(COORDINATOR_[A-Z0-9_]+)`)
	vars := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		for _, m := range re.FindAllStringSubmatch(f.Usage, -1) {
			vars[m[1]] = true
		}
	})
	require.Greater(t, len(vars), 10, "config flags should name their variables")
	return vars
}

// codeMetrics returns every coordinator_* metric name declared in the code
// (Name: "coordinator_..." in the Opts of a collector, or the name of a
// prometheus.NewDesc / a local desc helper d("coordinator_...", ...)).
func codeMetrics(t *testing.T) map[string]bool {
	t.Helper()
	re := regexp.MustCompile(`(?:Name:\s*|NewDesc\(\s*|\bd\(\s*)"(coordinator_[a-z0-9_]+)"`)
	names := map[string]bool{}
	for _, dir := range []string{"internal", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range re.FindAllSubmatch(b, -1) {
				names[string(m[1])] = true
			}
			return nil
		})
		require.NoError(t, err)
	}
	require.NotEmpty(t, names)
	return names
}

var metricRef = regexp.MustCompile(`\bcoordinator_[a-z0-9_]+\b`)

// unknownMetrics returns the coordinator_* names expr uses that the code does
// not declare (a histogram's _bucket/_sum/_count series count as its name).
func unknownMetrics(expr string, known map[string]bool) []string {
	var out []string
	for _, ref := range metricRef.FindAllString(expr, -1) {
		name := ref
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(ref, suffix); ok && known[base] {
				name = base
			}
		}
		if !known[name] {
			out = append(out, ref)
		}
	}
	return out
}

func mapAt(t *testing.T, m map[string]any, path ...string) map[string]any {
	t.Helper()
	cur := m
	for _, p := range path {
		next, ok := cur[p].(map[string]any)
		require.Truef(t, ok, "%s: expected a mapping", strings.Join(path, "."))
		cur = next
	}
	return cur
}

func TestComposeFileMatchesComposeSpecification(t *testing.T) {
	t.Parallel()
	docs := yamlDocs(t, readFile(t, "compose.yaml"))
	require.Len(t, docs, 1)
	require.NoError(t, schema.Validate(docs[0]), "compose.yaml against the Compose Specification schema")

	// The validator is not a no-op: the same file with a misspelt key fails.
	broken := yamlDocs(t, readFile(t, "compose.yaml"))[0]
	mapAt(t, broken, "services", "redis")["healthcheks"] = map[string]any{"test": "true"}
	require.Error(t, schema.Validate(broken))
	broken = yamlDocs(t, readFile(t, "compose.yaml"))[0]
	mapAt(t, broken, "services", "coordinator-1", "depends_on", "migrate")["condition"] = "service_done"
	require.Error(t, schema.Validate(broken))
}

func TestComposeFileWiresTheStack(t *testing.T) {
	t.Parallel()
	doc := yamlDocs(t, readFile(t, "compose.yaml"))[0]
	services := mapAt(t, doc, "services")
	for _, want := range []string{"kafka", "redis", "postgres", "migrate", "coordinator-1", "coordinator-2", "coordinator-3"} {
		require.Contains(t, services, want)
	}
	vars := configVariables(t)
	replicaIDs := map[string]string{}
	for name := range services {
		svc := mapAt(t, services, name)
		if deps, ok := svc["depends_on"].(map[string]any); ok {
			for dep, v := range deps {
				require.Containsf(t, services, dep, "%s depends on a service that does not exist", name)
				cond := v.(map[string]any)["condition"]
				if dep == "migrate" {
					require.Equalf(t, "service_completed_successfully", cond, "%s -> migrate", name)
				} else {
					require.Equalf(t, "service_healthy", cond, "%s -> %s", name, dep)
					require.Containsf(t, mapAt(t, services, dep), "healthcheck", "%s waits for %s to be healthy, so it needs a healthcheck", name, dep)
				}
			}
		}
		if name == "migrate" {
			require.Equal(t, []any{"migrate", "up"}, svc["command"])
			continue
		}
		require.Containsf(t, svc, "healthcheck", "service %s", name)
		if !strings.HasPrefix(name, "coordinator-") {
			continue
		}
		env := mapAt(t, svc, "environment")
		for k := range env {
			require.Truef(t, vars[k], "%s sets %s, which the coordinator does not read", name, k)
		}
		id, _ := env["COORDINATOR_REPLICA_ID"].(string)
		require.NotEmptyf(t, id, "%s needs its own COORDINATOR_REPLICA_ID", name)
		require.NotContainsf(t, replicaIDs, id, "replica id %q used twice", id)
		replicaIDs[id] = name
		deps := mapAt(t, svc, "depends_on")
		for _, d := range []string{"migrate", "redis", "kafka"} {
			require.Containsf(t, deps, d, "%s must wait for %s", name, d)
		}
		require.Contains(t, svc["healthcheck"].(map[string]any)["test"], "http://127.0.0.1:8080/readyz")
	}
	require.Len(t, replicaIDs, 3)
}

func TestDockerfileIsMultiStageStaticAndNonRoot(t *testing.T) {
	t.Parallel()
	df := string(readFile(t, "Dockerfile"))
	var froms, users []string
	for _, line := range strings.Split(df, "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		switch strings.ToUpper(fields[0]) {
		case "FROM":
			froms = append(froms, fields[1])
		case "USER":
			users = append(users, fields[1])
		}
	}
	require.GreaterOrEqual(t, len(froms), 2, "multi-stage build")
	require.Contains(t, df, "CGO_ENABLED=0", "static binary")
	require.Contains(t, df, "COPY --from=build")
	require.NotEmpty(t, users, "a USER line")
	last := users[len(users)-1]
	require.NotContains(t, []string{"root", "0", "0:0"}, last)
	require.NotRegexp(t, `^0(:|$)`, last)
	require.Contains(t, df, `ENTRYPOINT ["/usr/local/bin/coordinator"]`)

	ignore := string(readFile(t, ".dockerignore"))
	for _, want := range []string{".git", ".services", ".cache"} {
		require.Contains(t, strings.Fields(ignore), want)
	}
	// Every directory the build COPYs is in the context.
	for _, dir := range []string{"cmd", "internal", "migrations"} {
		require.NotContains(t, strings.Fields(ignore), dir)
		require.DirExists(t, filepath.Join(root, dir))
	}
}

// runbookAnchors returns the GitHub anchors of docs/runbook.md's headings.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	anchors := map[string]bool{}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	for _, line := range strings.Split(string(readFile(t, "docs/runbook.md")), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		anchors[strings.ReplaceAll(drop.ReplaceAllString(h, ""), " ", "-")] = true
	}
	return anchors
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func TestAlertRulesUseRealMetricsAndHaveRunbookEntries(t *testing.T) {
	t.Parallel()
	var rf ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(readFile(t, "deploy/prometheus/alerts.yaml")))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&rf))
	known := codeMetrics(t)
	anchors := runbookAnchors(t)

	alerts := map[string]string{}
	for _, g := range rf.Groups {
		require.NotEmpty(t, g.Name)
		for _, r := range g.Rules {
			require.NotEmptyf(t, r.Alert, "group %s has a rule without an alert name", g.Name)
			require.NotContainsf(t, alerts, r.Alert, "alert %s defined twice", r.Alert)
			alerts[r.Alert] = r.For
			require.NotEmptyf(t, strings.TrimSpace(r.Expr), "%s: expr", r.Alert)
			require.Emptyf(t, unknownMetrics(r.Expr, known), "%s uses metrics the code does not declare", r.Alert)
			require.Containsf(t, []string{"page", "ticket"}, r.Labels["severity"], "%s: severity", r.Alert)
			require.NotEmptyf(t, r.Annotations["summary"], "%s: summary", r.Alert)
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, "docs/runbook.md#")
			require.Truef(t, ok, "%s: runbook_url %q must point into docs/runbook.md", r.Alert, url)
			require.Equalf(t, strings.ToLower(r.Alert), anchor, "%s: anchor", r.Alert)
			require.Truef(t, anchors[anchor], "%s: docs/runbook.md has no heading for #%s", r.Alert, anchor)
			if r.For != "" {
				_, err := time.ParseDuration(r.For)
				require.NoErrorf(t, err, "%s: for", r.Alert)
			}
		}
	}
	// The alerts the issue and ADR-024's Consequences (docs/adr/024-distributed-lock-strategy.md) ask for.
	for _, want := range []string{"CoordinatorLockBackendUnavailable", "CoordinatorLeasesLost", "CoordinatorBillRunFailed",
		"CoordinatorTriggerDLQGrowing", "CoordinatorEventsDropped", "CoordinatorTriggerRetrying",
		"CoordinatorConsoleLoginFailures"} {
		require.Contains(t, alerts, want)
	}
	d, err := time.ParseDuration(alerts["CoordinatorLockBackendUnavailable"])
	require.NoError(t, err)
	require.GreaterOrEqual(t, d, time.Minute, "lock backend unavailable for over a minute")
}

func TestUnknownMetricIsCaught(t *testing.T) {
	t.Parallel()
	known := map[string]bool{"coordinator_lock_hold_seconds": true}
	require.Empty(t, unknownMetrics(`rate(coordinator_lock_hold_seconds_bucket[5m])`, known))
	require.Equal(t, []string{"coordinator_lock_nope_total"}, unknownMetrics(`rate(coordinator_lock_nope_total[5m]) > 0`, known))
}

func TestGrafanaDashboardUsesRealMetrics(t *testing.T) {
	t.Parallel()
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(readFile(t, "deploy/grafana/coordinator-dashboard.json"), &dash))
	require.NotEmpty(t, dash.UID)
	known := codeMetrics(t)
	used := map[string]bool{}
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		require.NotEmptyf(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			require.Emptyf(t, unknownMetrics(tg.Expr, known), "panel %q", p.Title)
			for _, m := range metricRef.FindAllString(tg.Expr, -1) {
				used[m] = true
			}
		}
	}
	// The areas the issue asks to see: locks, runs, batches, the reaper,
	// consumer lag, events buffered and dropped.
	for _, prefix := range []string{"coordinator_lock_", "coordinator_billrun_runs", "coordinator_billrun_batches",
		"coordinator_reaper_", "coordinator_trigger_consumer_lag", "coordinator_events_buffered", "coordinator_events_dropped",
		// Issue 17: runs in flight, what is deployed, the client pools.
		"coordinator_run_progress_", "coordinator_build_info", "coordinator_pgxpool_", "coordinator_redis_pool_"} {
		found := false
		for m := range used {
			found = found || strings.HasPrefix(m, prefix)
		}
		require.Truef(t, found, "no panel shows %s*", prefix)
	}
}

// k8sManifests decodes deploy/k8s: the documents by kind (each with its
// file name under "_file") and the kustomization.
func k8sManifests(t *testing.T) (byKind map[string][]map[string]any, kustomization map[string]any) {
	t.Helper()
	dir := filepath.Join(root, "deploy", "k8s")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	byKind = map[string][]map[string]any{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		for _, d := range yamlDocs(t, readFile(t, filepath.Join("deploy", "k8s", e.Name()))) {
			kind, _ := d["kind"].(string)
			require.NotEmptyf(t, kind, "%s: kind", e.Name())
			require.NotEmptyf(t, d["apiVersion"], "%s: apiVersion", e.Name())
			if kind == "Kustomization" {
				kustomization = d
				continue
			}
			require.NotEmptyf(t, mapAt(t, d, "metadata")["name"], "%s: metadata.name", e.Name())
			d["_file"] = e.Name()
			byKind[kind] = append(byKind[kind], d)
		}
	}
	require.NotNil(t, kustomization)
	return byKind, kustomization
}

func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	vars := configVariables(t)
	dir := filepath.Join(root, "deploy", "k8s")
	byKind, kustomization := k8sManifests(t)
	for _, r := range kustomization["resources"].([]any) {
		require.FileExists(t, filepath.Join(dir, r.(string)))
	}
	for _, k := range []string{"Deployment", "PodDisruptionBudget", "HorizontalPodAutoscaler", "ConfigMap", "CronJob", "Service", "PodMonitor"} {
		require.Lenf(t, byKind[k], 1, "one %s", k)
	}

	for _, cm := range byKind["ConfigMap"] {
		data := cm
		if d, ok := cm["data"].(map[string]any); ok {
			data = d
		}
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if strings.HasPrefix(k, "COORDINATOR_") {
				require.Truef(t, vars[k], "%s is not a configuration variable", k)
			}
		}
	}

	dep := byKind["Deployment"][0]
	spec := mapAt(t, dep, "spec")
	require.Equal(t, 3, spec["replicas"])
	pod := mapAt(t, spec, "template", "spec")
	c := pod["containers"].([]any)[0].(map[string]any)
	require.Equal(t, []any{"serve"}, c["args"])
	require.Equal(t, "/healthz", mapAt(t, c, "livenessProbe", "httpGet")["path"])
	require.Equal(t, "/readyz", mapAt(t, c, "readinessProbe", "httpGet")["path"])
	require.NotEmpty(t, mapAt(t, c, "resources", "requests"))
	require.NotEmpty(t, mapAt(t, c, "resources", "limits"))
	require.Equal(t, true, mapAt(t, pod, "securityContext")["runAsNonRoot"])
	require.Greater(t, pod["terminationGracePeriodSeconds"], 30, "longer than COORDINATOR_SHUTDOWN_TIMEOUT")

	selector := mapAt(t, spec, "selector", "matchLabels")
	require.Equal(t, selector, mapAt(t, byKind["PodDisruptionBudget"][0], "spec", "selector", "matchLabels"))
	require.Equal(t, "coordinator", mapAt(t, byKind["HorizontalPodAutoscaler"][0], "spec", "scaleTargetRef")["name"])
	require.GreaterOrEqual(t, mapAt(t, byKind["HorizontalPodAutoscaler"][0], "spec")["minReplicas"], 3)

	cj := byKind["CronJob"][0]
	jc := mapAt(t, cj, "spec", "jobTemplate", "spec", "template", "spec")["containers"].([]any)[0].(map[string]any)
	require.Equal(t, []any{"run", "reaper"}, jc["args"])
	_, err := cronspec.Parse(mapAt(t, cj, "spec")["schedule"].(string))
	require.NoError(t, err)
}

func TestDocsCoverConfigurationEventsAndExitCodes(t *testing.T) {
	t.Parallel()
	cfgDoc := string(readFile(t, "docs/configuration.md"))
	vars := configVariables(t)
	names := make([]string, 0, len(vars))
	for v := range vars {
		names = append(names, v)
	}
	slices.Sort(names)
	for _, v := range names {
		require.Containsf(t, cfgDoc, "`"+v+"`", "docs/configuration.md misses %s", v)
	}

	catalogue := string(readFile(t, "docs/events.md"))
	for _, typ := range []events.Type{events.OwnershipAcquired, events.OwnershipAlreadyOwned, events.OwnershipUnavailable,
		events.OwnershipLost, events.OwnershipReleased, events.RunCompleted, events.RunAlreadyCompleted, events.RunFailed,
		events.BillrunInvoiceConflict, events.BillrunLateUsage, events.TriggerRejected} {
		require.Containsf(t, catalogue, `"type": "`+string(typ)+`"`, "docs/events.md has no example of %s", typ)
	}
	// Each example in the catalogue is valid JSON in CloudEvents form.
	blocks := regexp.MustCompile("(?s)```json\n(.*?)```").FindAllStringSubmatch(catalogue, -1)
	require.GreaterOrEqual(t, len(blocks), 10)
	for _, b := range blocks {
		var ce events.CloudEvent
		require.NoError(t, json.Unmarshal([]byte(b[1]), &ce), b[1])
		require.Equal(t, "1.0", ce.SpecVersion)
		require.Equal(t, events.Source, ce.Source)
		require.Equal(t, ce.Subject, ce.Data["key"])
	}

	readme := string(readFile(t, "README.md"))
	for _, want := range []string{"make demo", "make test", "```mermaid", "75", "69", "76", "64", "docs/runbook.md", "docs/events.md", "docs/configuration.md"} {
		require.Containsf(t, readme, want, "README.md")
	}
}

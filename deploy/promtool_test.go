package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.yaml.in/yaml/v3"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/kinds"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/topics"
)

const (
	alertsFile     = "deploy/prometheus/alerts.yaml"
	alertTestsFile = "deploy/prometheus/alerts_test.yaml"
)

// promtool is the promtool the tests run: $COORDINATOR_TEST_PROMTOOL
// (scripts/services env), else one on PATH. Missing, the test fails: the
// rules and the scrape must be checked on every run.
func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("COORDINATOR_TEST_PROMTOOL"); p != "" {
		return p
	}
	p, err := exec.LookPath("promtool")
	require.NoError(t, err, "promtool is missing: run `scripts/services install promtool` (make test does), then eval \"$(scripts/services env)\"")
	return p
}

// runPromtool runs promtool in the repository root with stdin and returns
// its combined output; a non-zero exit fails the test with that output.
func runPromtool(t *testing.T, stdin []byte, args ...string) string {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = root
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	require.NoErrorf(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

// The rules parse, and every rule test passes (promtool test rules: alerts
// that must fire do, at the times given, with their labels and annotations;
// those that must not, do not).
func TestAlertRulesPassPromtool(t *testing.T) {
	t.Parallel()
	runPromtool(t, nil, "check", "rules", alertsFile)
	out := runPromtool(t, nil, "test", "rules", alertTestsFile)
	require.Contains(t, out, "SUCCESS")
}

// ruleTests is the part of promtool's rule-test file this test reads.
type ruleTests struct {
	RuleFiles []string `yaml:"rule_files"`
	Tests     []struct {
		Name   string `yaml:"name"`
		Series []struct {
			Series string `yaml:"series"`
			Values string `yaml:"values"`
		} `yaml:"input_series"`
		AlertTests []struct {
			EvalTime  string           `yaml:"eval_time"`
			AlertName string           `yaml:"alertname"`
			ExpAlerts []map[string]any `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// Every alert has rule tests: one where it fires and one where it stays
// quiet. An alert on a counter's increase() or rate() fires in a test whose
// input series start at 0 after having been absent: the first occurrence
// right after a replica starts, the case a counter first seen at 1 misses
// (its increase is 0). The replica creates those series at 0 (the live
// scrape test below checks it).
func TestEveryAlertHasRuleTestsIncludingTheFirstOccurrenceAfterAStart(t *testing.T) {
	t.Parallel()
	var rf ruleFile
	require.NoError(t, yaml.Unmarshal(readFile(t, alertsFile), &rf))
	var rt ruleTests
	dec := yaml.NewDecoder(bytes.NewReader(readFile(t, alertTestsFile)))
	require.NoError(t, dec.Decode(&rt))
	require.Equal(t, []string{"alerts.yaml"}, rt.RuleFiles)

	fires, quiet, firstAfterStart := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, tc := range rt.Tests {
		require.NotEmpty(t, tc.Name, "every rule test is named")
		for _, at := range tc.AlertTests {
			if len(at.ExpAlerts) == 0 {
				quiet[at.AlertName] = true
				continue
			}
			fires[at.AlertName] = true
			// A series absent, then 0, then higher: "_x3 0 1 ..." or "_ 0+1x5".
			for _, s := range tc.Series {
				if startsAtZeroAfterAbsence(s.Values) {
					firstAfterStart[at.AlertName] = true
				}
			}
		}
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			require.Truef(t, fires[r.Alert], "%s has no rule test in which it fires (%s)", r.Alert, alertTestsFile)
			require.Truef(t, quiet[r.Alert], "%s has no rule test in which it stays quiet (%s)", r.Alert, alertTestsFile)
			if counterAlert(r.Expr) {
				require.Truef(t, firstAfterStart[r.Alert],
					"%s reads a counter: a test must fire on a series that starts at 0 after a start (values \"_ 0 1 ...\")", r.Alert)
			}
		}
	}
}

// counterAlert: the expression reads a counter's increase or rate.
func counterAlert(expr string) bool {
	return strings.Contains(expr, "increase(") || strings.Contains(expr, "rate(")
}

// startsAtZeroAfterAbsence: promtool values that begin with missing samples
// ("_" or "_xN") and whose first sample is 0, later higher.
func startsAtZeroAfterAbsence(values string) bool {
	f := strings.Fields(values)
	i := 0
	for i < len(f) && (f[i] == "_" || strings.HasPrefix(f[i], "_x")) {
		i++
	}
	if i == 0 || i >= len(f) {
		return false
	}
	first := f[i]
	return first == "0" || strings.HasPrefix(first, "0+") && !strings.HasPrefix(first, "0+0x")
}

func TestStartsAtZeroAfterAbsence(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]bool{"_x3 0 1 1": true, "_ 0+1x5": true, "_ _ 0 2": true, "0 1": false,
		"_x3 1 1": false, "_x2 0+0x10": false, "_x5": false} {
		require.Equalf(t, want, startsAtZeroAfterAbsence(v), "%q", v)
	}
}

// selector is one vector selector of a rule: a metric name and its
// equality and regexp matchers.
type selector struct {
	name   string
	equal  map[string]string
	regexp map[string]string
}

var (
	selectorRE = regexp.MustCompile(`\b(coordinator_[a-z0-9_]+)\s*(\{[^}]*\})?`)
	matcherRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)\s*"([^"]*)"`)
)

// selectors are the coordinator_* vector selectors of expr.
func selectors(expr string) []selector {
	var out []selector
	for _, m := range selectorRE.FindAllStringSubmatch(expr, -1) {
		s := selector{name: m[1], equal: map[string]string{}, regexp: map[string]string{}}
		for _, lm := range matcherRE.FindAllStringSubmatch(m[2], -1) {
			switch lm[2] {
			case "=":
				s.equal[lm[1]] = lm[3]
			case "=~":
				s.regexp[lm[1]] = lm[3]
			}
		}
		out = append(out, s)
	}
	return out
}

// series is one sample's name and labels in a scrape.
type series struct {
	name   string
	labels map[string]string
}

// scrapeSeries parses a /metrics body into its series (a histogram's as
// NAME_bucket, NAME_sum and NAME_count, as PromQL names them).
func scrapeSeries(t *testing.T, body []byte) []series {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	require.NoError(t, err)
	var out []series
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			names := []string{name}
			switch mf.GetType().String() {
			case "HISTOGRAM":
				names = []string{name + "_bucket", name + "_sum", name + "_count"}
			case "SUMMARY":
				names = []string{name, name + "_sum", name + "_count"}
			}
			for _, n := range names {
				out = append(out, series{name: n, labels: labels})
			}
		}
	}
	return out
}

// missing returns what of s no series of the scrape has: "" when one
// matches it. A regexp matcher that is an alternation of plain values
// (a|b) needs a series for each of them.
func (s selector) missing(all []series) string {
	var want []map[string]string
	want = append(want, s.equal)
	for label, re := range s.regexp {
		if !regexp.MustCompile(`^[a-z0-9_|]+$`).MatchString(re) {
			continue
		}
		var next []map[string]string
		for _, w := range want {
			for _, alt := range strings.Split(re, "|") {
				m := map[string]string{label: alt}
				for k, v := range w {
					m[k] = v
				}
				next = append(next, m)
			}
		}
		want = next
	}
	for _, w := range want {
		found := slices.ContainsFunc(all, func(se series) bool {
			if se.name != s.name {
				return false
			}
			for k, v := range w {
				if se.labels[k] != v {
					return false
				}
			}
			return true
		})
		if !found {
			return fmt.Sprintf("%s%v", s.name, w)
		}
	}
	return ""
}

// serve runs `coordinator serve` on the test's own database schema, Redis
// prefix and Kafka topics, and returns its admin address once it started,
// and the brokers and topic names it uses.
func serve(t *testing.T) (string, []string, topics.Names) {
	t.Helper()
	pg, rd, kafka := testenv.Postgres(t), testenv.Redis(t), testenv.Kafka(t)
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "COORDINATOR_") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"COORDINATOR_DATABASE_URL="+pg.DSN,
		"COORDINATOR_LOCK_REDIS_URL="+rd.URL,
		"COORDINATOR_LOCK_KEY_PREFIX="+rd.Prefix,
		"COORDINATOR_KAFKA_BROKERS="+strings.Join(kafka.Brokers, ","),
		"COORDINATOR_KAFKA_TOPIC_PREFIX="+kafka.Suffix,
		"COORDINATOR_KAFKA_GROUP=g_"+kafka.Suffix,
		"COORDINATOR_HTTP_ADDR=127.0.0.1:0",
		"COORDINATOR_ADMIN_TOKEN="+testenv.AdminToken(),
		"COORDINATOR_LOG_FORMAT=json",
		"COORDINATOR_REPLICA_ID=scrape",
		"COORDINATOR_HEALTH_CHECK_INTERVAL=1s",
	)
	cmd := exec.Command(testenv.CoordinatorBinary(t), "serve")
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var mu sync.Mutex
	var lines []string
	started, done := make(chan string, 1), make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, sc.Text())
			mu.Unlock()
			var l struct {
				Msg  string `json:"msg"`
				Addr string `json:"http_addr"`
			}
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == "coordinator_started" {
				started <- l.Addr
			}
		}
		_ = cmd.Wait()
	}()
	logs := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(lines, "\n")
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL) // by its PID, ours
		<-done
		if t.Failed() {
			t.Logf("coordinator serve log:\n%s", logs())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if cl, err := kgo.NewClient(kgo.SeedBrokers(kafka.Brokers...)); err == nil {
			adm := kadm.NewClient(cl)
			if topics, err := adm.ListTopics(ctx); err == nil {
				var mine []string
				for _, name := range topics.Names() {
					if strings.HasSuffix(name, "."+kafka.Suffix) || strings.HasPrefix(name, kafka.Suffix+".") {
						mine = append(mine, name)
					}
				}
				_, _ = adm.DeleteTopics(ctx, mine...)
			}
			_, _ = adm.DeleteGroups(ctx, "g_"+kafka.Suffix)
			cl.Close()
		}
	})
	reg, err := kinds.Registry(config.Config{})
	require.NoError(t, err)
	names := topics.New(kafka.Suffix, reg.Topics()...)
	select {
	case addr := <-started:
		return addr, kafka.Brokers, names
	case <-done:
		t.Fatalf("coordinator serve exited before starting:\n%s", logs())
	case <-time.After(60 * time.Second):
		t.Fatalf("coordinator serve did not start within 60s:\n%s", logs())
	}
	return "", nil, names
}

func scrape(t *testing.T, addr string) []byte {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return body
}

// A real `coordinator serve`'s /metrics passes `promtool check metrics`
// (names, types and help follow Prometheus' conventions: a gauge is not named
// *_total), and every series an alert rule selects exists in it right after
// start, under the name and with the label values the rule uses: so a
// rename cannot silently break an alert, and every labelled counter an alert
// reads is there at 0 before its first increment (else increase() misses the
// first occurrence after a start).
func TestLiveScrapePassesPromtoolAndHasEveryAlertsSeries(t *testing.T) {
	t.Parallel()
	promtool(t) // fail early, before starting anything
	addr, brokers, names := serve(t)
	// The consumer's lag is per partition, known from the first record it
	// fetches: one malformed trigger (dead-lettered) makes it known.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: names.Topic(billrun.Topic), Value: []byte("not json")}).FirstErr())

	var rf ruleFile
	require.NoError(t, yaml.Unmarshal(readFile(t, alertsFile), &rf))
	var sels []selector
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			sels = append(sels, selectors(r.Expr)...)
		}
	}
	require.NotEmpty(t, sels)

	// The dependency checks and the consumer's partitions come moments
	// after start: wait for their series, then check the whole scrape.
	var body []byte
	var gaps []string
	deadline := time.Now().Add(60 * time.Second)
	for {
		body = scrape(t, addr)
		all := scrapeSeries(t, body)
		gaps = gaps[:0]
		for _, s := range sels {
			if m := s.missing(all); m != "" {
				gaps = append(gaps, m)
			}
		}
		if len(gaps) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	require.Empty(t, gaps, "series the alert rules select, missing from a live scrape")

	out := runPromtool(t, body, "check", "metrics")
	require.NotContains(t, out, "_total", "promtool check metrics:\n%s", out)
	// The gauges kprom named like counters, renamed (docs/observability.md).
	scraped := map[string]bool{}
	for _, s := range scrapeSeries(t, body) {
		scraped[s.name] = true
	}
	for _, old := range []string{"coordinator_kafka_buffered_fetch_records_total", "coordinator_kafka_buffered_produce_records_total"} {
		require.False(t, scraped[old], "%s is a gauge named like a counter", old)
	}
	require.True(t, scraped["coordinator_kafka_buffered_fetch_records"])
	require.True(t, scraped["coordinator_kafka_buffered_produce_records"])
}

// The selector check is not vacuous: a renamed metric, a label value the
// scrape lacks, or one alternative of a regexp missing are caught.
func TestSelectorCheckCatchesRenamesAndMissingLabels(t *testing.T) {
	t.Parallel()
	all := scrapeSeries(t, []byte(`# TYPE coordinator_x_total counter
coordinator_x_total{outcome="failed"} 0
coordinator_x_total{outcome="ok"} 3
# TYPE coordinator_h_seconds histogram
coordinator_h_seconds_bucket{job="a",le="+Inf"} 0
coordinator_h_seconds_sum{job="a"} 0
coordinator_h_seconds_count{job="a"} 0
`))
	ok := func(expr string) {
		for _, s := range selectors(expr) {
			require.Empty(t, s.missing(all), expr)
		}
	}
	bad := func(expr string) {
		var gaps []string
		for _, s := range selectors(expr) {
			if m := s.missing(all); m != "" {
				gaps = append(gaps, m)
			}
		}
		require.NotEmpty(t, gaps, expr)
	}
	ok(`increase(coordinator_x_total{outcome="failed"}[15m]) > 0`)
	ok(`increase(coordinator_x_total{outcome=~"failed|ok"}[15m]) > 0`)
	ok(`increase(coordinator_h_seconds_count{job="a"}[15m]) > 0`)
	bad(`increase(coordinator_y_total[15m]) > 0`)
	bad(`increase(coordinator_x_total{outcome="lost"}[15m]) > 0`)
	bad(`increase(coordinator_x_total{outcome=~"failed|lost"}[15m]) > 0`)
	bad(`increase(coordinator_h_seconds_count{job="b"}[15m]) > 0`)
}

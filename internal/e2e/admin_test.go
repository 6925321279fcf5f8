package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pressly/goose/v3/lock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/testenv"
)

// healthReport is the body of GET /v1/health.
type healthReport struct {
	Status       string
	Ready        bool
	NotReady     map[string]string `json:"not_ready"`
	Dependencies []struct {
		Name    string
		Checked bool
		OK      bool
		Error   string
	}
}

func (h healthReport) dep(name string) (ok, checked bool, errText string) {
	for _, d := range h.Dependencies {
		if d.Name == name {
			return d.OK, d.Checked, d.Error
		}
	}
	return false, false, ""
}

func (r *replica) health(t *testing.T, token string) healthReport {
	t.Helper()
	code, body := r.get(t, token, "/v1/health")
	require.Equal(t, http.StatusOK, code, string(body))
	var h healthReport
	require.NoError(t, json.Unmarshal(body, &h), string(body))
	return h
}

// concurrently sends n GETs of path at once and returns the status codes
// and bodies.
func (r *replica) concurrently(t *testing.T, n int, path string) ([]int, []string) {
	t.Helper()
	codes, bodies := make([]int, n), make([]string, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			resp, err := http.Get("http://" + r.addr + path)
			if err != nil {
				bodies[i] = err.Error()
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			codes[i], bodies[i] = resp.StatusCode, string(b)
		})
	}
	close(start)
	wg.Wait()
	return codes, bodies
}

// leaks lists the connection details that must never appear in an
// unauthenticated answer: the database's user, name, host and port, the
// schema, and Redis' address.
func leaks(t *testing.T, dsn, redisURL, schema string) []string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	ru, err := url.Parse(redisURL)
	require.NoError(t, err)
	out := []string{u.User.Username() + "@", strings.TrimPrefix(u.Path, "/"), u.Hostname(), ":" + u.Port(), schema, ":" + ru.Port(), "dial tcp"}
	if pw, ok := u.User.Password(); ok {
		out = append(out, pw)
	}
	return out
}

func requireNoLeak(t *testing.T, body string, forbidden []string) {
	t.Helper()
	for _, f := range forbidden {
		require.NotContains(t, body, f, "an unauthenticated answer shows a connection detail")
	}
}

// /readyz answers from memory: 48 concurrent calls while the migration lock
// is held are all 200, and so are they while Redis is down, so the admin
// API stays reachable in an incident; its body names conditions only. The
// detail is in /v1/health, behind a token, and in coordinator_dependency_up.
// A replica started before `migrate up` is not ready, naming migrations
// only, until the migrations are applied.
func TestReadinessIsCheapAndSeparateFromDependencies(t *testing.T) {
	t.Parallel()
	rds := testenv.StartRedisServer(t)
	d := newDeployment(t, rds.URL())
	forbidden := leaks(t, d.pg.DSN, rds.URL(), d.pg.Schema)
	fast := map[string]string{"COORDINATOR_HEALTH_CHECK_INTERVAL": "200ms"}
	r := d.start("steady", fast, "--reaper-schedule=")
	ctx := context.Background()

	t.Run("48 concurrent calls while migrate up holds the migration lock", func(t *testing.T) {
		// The advisory lock `coordinator migrate up` takes (goose's default
		// id, one per database), held here for the duration of the calls.
		conn, err := d.pg.Pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		_, err = conn.Exec(ctx, `select pg_advisory_lock($1)`, lock.DefaultLockID)
		require.NoError(t, err)
		defer func() {
			_, err := conn.Exec(ctx, `select pg_advisory_unlock($1)`, lock.DefaultLockID)
			require.NoError(t, err)
		}()
		var held bool
		require.NoError(t, d.pg.Pool.QueryRow(ctx, `select exists (select 1 from pg_locks where locktype = 'advisory' and granted
			and ((classid::bigint << 32) | objid::bigint) = $1)`, lock.DefaultLockID).Scan(&held))
		require.True(t, held, "the migration lock is held")

		codes, bodies := r.concurrently(t, 48, "/readyz")
		for i := range codes {
			require.Equal(t, http.StatusOK, codes[i], bodies[i])
			require.JSONEq(t, `{"status":"ready","replica":"steady"}`, bodies[i])
		}
		codes, _ = r.concurrently(t, 48, "/healthz")
		for _, c := range codes {
			require.Equal(t, http.StatusOK, c)
		}
	})

	t.Run("redis down: still ready, the admin API answers, /v1/health has the detail", func(t *testing.T) {
		require.Eventually(t, func() bool { ok, _, _ := r.health(t, d.token).dep("redis"); return ok }, 10*time.Second, 50*time.Millisecond)
		rds.Stop()
		defer rds.Start()
		var h healthReport
		require.Eventually(t, func() bool {
			h = r.health(t, d.token)
			ok, checked, _ := h.dep("redis")
			return checked && !ok
		}, 10*time.Second, 50*time.Millisecond, "the background check notices Redis is down")
		require.Equal(t, "degraded", h.Status)
		require.True(t, h.Ready)
		_, _, errText := h.dep("redis")
		require.Contains(t, errText, rds.Addr(), "the authenticated detail says what failed")
		pgOK, _, _ := h.dep("postgres")
		require.True(t, pgOK)

		codes, bodies := r.concurrently(t, 40, "/readyz")
		for i := range codes {
			require.Equal(t, http.StatusOK, codes[i], bodies[i])
			requireNoLeak(t, bodies[i], forbidden)
		}
		code, body := r.get(t, "", "/v1/health")
		require.Equal(t, http.StatusUnauthorized, code, "the detail needs a token")
		requireNoLeak(t, string(body), forbidden)

		// Work is refused fail-closed, by an API that is still there.
		code, _, body = r.post(t, d.token, "/v1/billruns", `{"period":"`+monthsAgo(5)+`"}`)
		require.Equal(t, http.StatusServiceUnavailable, code, string(body))
		require.Contains(t, string(body), `"code":"LOCK_ACQUISITION_FAILED"`)

		code, body = r.get(t, "", "/metrics")
		require.Equal(t, http.StatusOK, code)
		require.Contains(t, string(body), `coordinator_dependency_up{dependency="redis"} 0`)
		require.Contains(t, string(body), `coordinator_dependency_up{dependency="postgres"} 1`)
		require.True(t, hasLogLine(r, `"level":"WARN","msg":"dependency_down"`, `"dependency":"redis"`))
	})

	t.Run("redis back: the dependency recovers", func(t *testing.T) {
		require.Eventually(t, func() bool { ok, _, _ := r.health(t, d.token).dep("redis"); return ok }, 20*time.Second, 50*time.Millisecond)
		require.True(t, hasLogLine(r, `"msg":"dependency_up"`, `"dependency":"redis"`))
	})

	t.Run("started before migrate up: not ready, naming migrations only, until applied", func(t *testing.T) {
		empty := testenv.PostgresEmpty(t)
		forbidden := leaks(t, empty.DSN, rds.URL(), empty.Schema)
		early := d.start("early", map[string]string{"COORDINATOR_HEALTH_CHECK_INTERVAL": "200ms", "COORDINATOR_DATABASE_URL": empty.DSN},
			"--reaper-schedule=")
		code, body := early.get(t, "", "/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code, string(body))
		var p struct {
			Code   string
			Detail string
			Checks map[string]string
		}
		require.NoError(t, json.Unmarshal(body, &p))
		require.Equal(t, "NOT_READY", p.Code)
		require.Equal(t, "not ready: migrations", p.Detail)
		require.Len(t, p.Checks, 1)
		require.Regexp(t, regexp.MustCompile("^[0-9]+ migrations pending: run `coordinator migrate up`$"), p.Checks["migrations"])
		requireNoLeak(t, string(body), forbidden)
		require.Equal(t, http.StatusOK, mustGet(t, early, "/healthz"), "alive all the same")

		// The real `coordinator migrate up`; readiness follows by itself.
		mig := exec.Command(testenv.CoordinatorBinary(t), "migrate", "up")
		mig.Env = append(cleanEnv(), "COORDINATOR_DATABASE_URL="+empty.DSN)
		out, err := mig.CombinedOutput()
		require.NoError(t, err, string(out))
		require.Eventually(t, func() bool { return mustGet(t, early, "/readyz") == http.StatusOK }, 20*time.Second, 50*time.Millisecond)
		require.True(t, hasLogLine(early, `"msg":"migrations_applied"`))
		require.Equal(t, 0, early.terminate(t, 20*time.Second))
	})
	require.Equal(t, 0, r.terminate(t, 20*time.Second))
}

func mustGet(t *testing.T, r *replica, path string) int {
	t.Helper()
	code, _ := r.get(t, "", path)
	return code
}

// hasLogLine reports whether one log line of r holds every fragment.
func hasLogLine(r *replica, fragments ...string) bool {
	for _, l := range r.logLines() {
		all := true
		for _, f := range fragments {
			all = all && strings.Contains(l, f)
		}
		if all {
			return true
		}
	}
	return false
}

// cleanEnv is the test's environment without any coordinator variable.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "COORDINATOR_") || k == "DATABASE_URL" || k == "REDIS_URL" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// Named tokens with scopes from COORDINATOR_ADMIN_TOKENS_FILE: a read token
// cannot start runs, a mutate token cannot read; refusals are warn log
// lines without any token. Who asked (the body's requested_by, else the
// token's name) and the token's name as principal reach bill_runs, GET
// status and every event of every kind. Garbage methods leave the method
// label bounded.
func TestAdminTokensScopesAndWhoAsked(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, "")
	period := monthsAgo(5)
	d.seedSubscribers(300, period)
	ops, grafana, ci := testenv.AdminToken(), testenv.AdminToken(), testenv.AdminToken()
	file := filepath.Join(t.TempDir(), "admin-tokens")
	require.NoError(t, os.WriteFile(file, []byte("# name:scopes:token\nbilling-ops:read,mutate:"+ops+"\ngrafana:read:"+grafana+"\nci:mutate:"+ci+"\n"), 0o600))
	r := d.start("scoped", map[string]string{"COORDINATOR_ADMIN_TOKENS_FILE": file}, "--reaper-schedule=")
	secrets := []string{d.token, ops, grafana, ci}

	t.Run("scopes", func(t *testing.T) {
		code, _, body := r.post(t, grafana, "/v1/billruns", `{"period":"`+period+`"}`)
		require.Equal(t, http.StatusForbidden, code, string(body))
		require.Contains(t, string(body), `the token \"grafana\" has the scopes read`)
		code, body = r.get(t, grafana, "/v1/locks")
		require.Equal(t, http.StatusOK, code, string(body))
		code, body = r.get(t, ci, "/v1/locks")
		require.Equal(t, http.StatusForbidden, code, string(body))
		code, body = r.get(t, "not-a-token-but-long-enough-to-look-like-one", "/v1/health")
		require.Equal(t, http.StatusUnauthorized, code, string(body))
		code, body = r.get(t, d.token, "/v1/health")
		require.Equal(t, http.StatusOK, code, "COORDINATOR_ADMIN_TOKEN keeps every scope: %s", body)
		var bills int64
		require.NoError(t, d.pg.Pool.QueryRow(context.Background(), `select count(*) from bill_runs`).Scan(&bills))
		require.Zero(t, bills, "the read token started nothing")
		require.True(t, hasLogLine(r, `"level":"WARN","msg":"http_auth_failed"`, `"reason":"missing_scope","method":"POST","route":"POST /v1/billruns"`,
			`"principal":"grafana"`))
		require.True(t, hasLogLine(r, `"msg":"http_auth_failed"`, `"reason":"invalid_token"`, `"route":"GET /v1/health"`))
	})

	t.Run("requested_by and principal in bill_runs, status and events", func(t *testing.T) {
		code, _, body := r.post(t, ops, "/v1/billruns", `{"period":"`+period+`","requested_by":"alice","request_id":"who-asked-1"}`)
		require.Equal(t, http.StatusAccepted, code, string(body))
		key := "billrun:" + period
		d.events.waitFor(t, 30*time.Second, 1, "ownership.released", ofType("ownership.released", key))
		var by, principal, reqID, src string
		require.NoError(t, d.pg.Pool.QueryRow(context.Background(),
			`select requested_by, principal, request_id, trigger_source from bill_runs where period = $1`, period).Scan(&by, &principal, &reqID, &src))
		require.Equal(t, []string{"alice", "billing-ops", "who-asked-1", "http"}, []string{by, principal, reqID, src})
		code, body = r.get(t, grafana, "/v1/billruns/"+period)
		require.Equal(t, http.StatusOK, code, string(body))
		require.Contains(t, string(body), `"requested_by":"alice","principal":"billing-ops"`)
		evs := d.events.match(func(e event) bool { return e.Subject == key })
		require.GreaterOrEqual(t, len(evs), 3)
		for _, e := range evs {
			require.Equal(t, "alice", e.str("requested_by"), e.Type)
			require.Equal(t, "billing-ops", e.str("principal"), e.Type)
		}

		// Another kind, no requested_by in the body: the token's name.
		code, _, body = r.post(t, ci, "/v1/msisdn-reaper/sweeps", "")
		require.Equal(t, http.StatusOK, code, string(body))
		sweeps := d.events.waitFor(t, 10*time.Second, 1, "run.completed", ofType("run.completed", "msisdn-reaper:sweep"))
		require.Equal(t, "ci", sweeps[0].str("requested_by"))
		require.Equal(t, "ci", sweeps[0].str("principal"))
	})

	t.Run("the method label stays bounded", func(t *testing.T) {
		for i := range 30 {
			req, err := http.NewRequest(fmt.Sprintf("X-GARBAGE-%d", i), "http://"+r.addr+"/v1/locks", nil)
			require.NoError(t, err)
			code, _, _ := do(t, req)
			require.Equal(t, http.StatusMethodNotAllowed, code)
		}
		code, body := r.get(t, "", "/metrics")
		require.Equal(t, http.StatusOK, code)
		series := regexp.MustCompile(`(?m)^coordinator_http_requests_total\{[^}]*method="([^"]*)"`).FindAllStringSubmatch(string(body), -1)
		require.NotEmpty(t, series)
		for _, s := range series {
			require.Contains(t, []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE", "other"}, s[1])
		}
		require.Contains(t, string(body), `coordinator_http_requests_total{code="405",method="other",route="/v1/locks"} 30`)
		require.NotContains(t, string(body), "GARBAGE")
		require.Regexp(t, `coordinator_http_requests_total\{code="200",method="GET",route="GET /v1/billruns/\{id\}"\}`, string(body),
			"the route is the pattern, not the path")
	})

	require.Equal(t, 0, r.terminate(t, 20*time.Second))
	for _, l := range r.logLines() {
		for _, s := range secrets {
			require.NotContains(t, l, s, "no admin token in the log")
		}
	}
}

// With COORDINATOR_MAX_RUNS_IN_FLIGHT=1 a second POST while a bill run is in
// flight is 429 with Retry-After and starts nothing; once the run ended,
// the same POST is accepted.
func TestRunCapAnswers429(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, "")
	d.seedSubscribers(1000, monthsAgo(6))
	r := d.start("capped", map[string]string{"COORDINATOR_MAX_RUNS_IN_FLIGHT": "1", "COORDINATOR_TEST_BILLRUN_BATCH_DELAY": "1s"},
		"--reaper-schedule=")

	code, _, body := r.post(t, d.token, "/v1/billruns", `{"period":"`+monthsAgo(6)+`"}`)
	require.Equal(t, http.StatusAccepted, code, string(body))
	for _, req := range [][2]string{{"/v1/billruns", `{"period":"` + monthsAgo(7) + `"}`}, {"/v1/msisdn-reaper/sweeps", ""}} {
		code, hdr, body := r.post(t, d.token, req[0], req[1])
		require.Equal(t, http.StatusTooManyRequests, code, string(body))
		require.Equal(t, "10", hdr.Get("Retry-After"))
		require.Contains(t, string(body), `"code":"TOO_MANY_RUNS"`)
		require.Contains(t, string(body), "COORDINATOR_MAX_RUNS_IN_FLIGHT=1")
	}
	var rows int64
	require.NoError(t, d.pg.Pool.QueryRow(context.Background(), `select count(*) from bill_runs where period = $1`, monthsAgo(7)).Scan(&rows))
	require.Zero(t, rows, "a refused POST claims nothing")
	require.Empty(t, d.events.match(func(e event) bool { return e.Subject == "billrun:"+monthsAgo(7) || e.Subject == "msisdn-reaper:sweep" }),
		"and emits nothing")

	d.events.waitFor(t, 60*time.Second, 1, "run.completed", ofType("run.completed", "billrun:"+monthsAgo(6)))
	// The slot is freed just after the run's last event: ask until it is.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		code, _, body = r.post(t, d.token, "/v1/billruns", `{"period":"`+monthsAgo(7)+`"}`)
		require.NotEqual(c, http.StatusTooManyRequests, code)
	}, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, http.StatusAccepted, code, string(body))
	require.True(t, hasLogLine(r, `"msg":"trigger_refused_at_capacity"`))
	require.Equal(t, 0, r.terminate(t, 30*time.Second))
}

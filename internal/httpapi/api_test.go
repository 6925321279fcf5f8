package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/telco-platform/coordinator/internal/adminauth"
	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/health"
	"github.com/telco-platform/coordinator/internal/httpapi"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/msisdnreaper"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// token is the test's admin token, named "ops", with every scope.
const token = "s3cret-token-s3cret-token-s3cret-token"

var periodRE = regexp.MustCompile(`^2[0-9]{3}-(0[1-9]|1[0-2])$`)

// testNow is the bill-run kind's clock in these tests: 2026-11 is the
// latest closed period, 2026-12 the open one (UTC, 24 months back without
// force).
var testNow = time.Date(2026, time.December, 3, 7, 0, 0, 0, time.UTC)

// testKinds are the real bill-run and sweep kinds: the API decodes their
// bodies as in production.
func testKinds(t testing.TB) *owned.Registry {
	bills := billrun.New(billrun.Config{Calendar: billrun.Calendar{Now: func() time.Time { return testNow }}})
	reg, err := owned.NewRegistry(bills, msisdnreaper.NewSweepKind(msisdnreaper.Config{}))
	require.NoError(t, err)
	return reg
}

// fakeDispatcher stands in for trigger.Dispatcher behind the API's own
// interface. Bill-run outcomes are chosen per period; it records the
// triggers.
type fakeDispatcher struct {
	// atCapacity makes every call refused like the dispatcher at its cap.
	atCapacity bool
	mu         sync.Mutex
	outcomes   map[string]job.Outcome
	sweep      job.Outcome
	// sweepRetryable marks a failed sweep's cause transient.
	sweepRetryable bool
	err            error
	errOutcome     job.Outcome
	triggers       []job.Trigger
}

func (f *fakeDispatcher) Start(_ context.Context, k owned.Kind, p owned.Params, t job.Trigger) (job.Result, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.triggers = append(f.triggers, t)
	if f.atCapacity {
		return job.Result{Outcome: job.OutcomeUnavailable}, false, &job.CapacityError{Limit: 2, InFlight: 2}
	}
	if f.err != nil {
		return job.Result{Outcome: f.errOutcome}, false, f.err
	}
	period, _ := k.StatusID(p)
	res := job.Result{Job: k.Spec().Name, Key: k.LockKey(p), Replica: "r1", RequestID: t.RequestID}
	o, ok := f.outcomes[period]
	if !ok {
		// Like the template's Begin: a started run has an owner and a fence, no outcome yet.
		res.Owner, res.Fence = "r1", 7
		return res, true, nil
	}
	res.Outcome = o
	switch o {
	case job.OutcomeAlreadyOwned:
		res.Owner = "r2"
		switch period {
		case "2026-08", "2026-09":
			// A resumable kind: recorded for the resumer (09) or not,
			// Postgres down (08).
			res.Resumable, res.Deferred = true, period == "2026-09"
		}
	case job.OutcomeUnavailable:
		res.Error = "dial tcp 127.0.0.1:1: connection refused"
	case job.OutcomeFailed:
		res.Error = "batch 3: boom"
		switch period {
		case "2026-05":
			res.Error, res.BadInput = "bad input: period 2026-05's bill run is RUNNING, not COMPLETED: finish it first", true
		case "2026-06", "2026-07":
			// Postgres down at the claim; recorded for the resumer (07) or not (06).
			res.Error, res.Retryable, res.Deferred = "billrun: claim: dial tcp: connection refused", true, period == "2026-07"
		}
	}
	return res, false, nil
}

func (f *fakeDispatcher) Run(_ context.Context, k owned.Kind, p owned.Params, t job.Trigger) (job.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.triggers = append(f.triggers, t)
	if f.atCapacity {
		return job.Result{Outcome: job.OutcomeUnavailable}, &job.CapacityError{Limit: 2, InFlight: 2}
	}
	if f.err != nil {
		return job.Result{Outcome: f.errOutcome}, f.err
	}
	res := job.Result{Job: k.Spec().Name, Key: k.LockKey(p), Replica: "r1", Outcome: cmpOutcome(f.sweep), RequestID: t.RequestID,
		Retryable: f.sweepRetryable}
	if res.Outcome == job.OutcomeCompleted {
		res.Counts = map[string]int64{"freed": 3}
	}
	if res.Outcome == job.OutcomeAlreadyOwned {
		res.Owner = "r3"
	}
	return res, nil
}

func (f *fakeDispatcher) Status(_ context.Context, _ owned.Kind, id string) (any, error) {
	switch {
	case !periodRE.MatchString(id):
		return nil, job.BadInput("period %q is not YYYY-MM", id)
	case id == "2026-11":
		return map[string]any{"period": id, "status": "COMPLETED", "owner": "r1", "fence": 2}, nil
	case id == "2026-12":
		return nil, errors.New("postgres: connection refused")
	}
	return nil, owned.ErrNotFound
}

func (f *fakeDispatcher) lastTrigger(t *testing.T) job.Trigger {
	f.mu.Lock()
	defer f.mu.Unlock()
	require.NotEmpty(t, f.triggers)
	return f.triggers[len(f.triggers)-1]
}

func cmpOutcome(o job.Outcome) job.Outcome {
	if o == "" {
		return job.OutcomeCompleted
	}
	return o
}

type fakeLocks struct {
	locks []ownership.LockInfo
	err   error
}

func (f fakeLocks) Locks(context.Context) ([]ownership.LockInfo, error) { return f.locks, f.err }

type bundle struct {
	api  *httpapi.API
	disp *fakeDispatcher
	reg  *prometheus.Registry
	logs *testenv.Buffer
}

// Further test tokens with one scope each.
const (
	readToken   = "read-only-token-read-only-token-xx"
	mutateToken = "mutate-only-token-mutate-only-token"
)

func testTokens() []adminauth.Token {
	return []adminauth.Token{
		{Name: "ops", Scopes: adminauth.All, Secret: token},
		{Name: "grafana", Scopes: adminauth.Read, Secret: readToken},
		{Name: "ci", Scopes: adminauth.Mutate, Secret: mutateToken},
	}
}

func setup(t *testing.T, mod func(*httpapi.Config)) bundle {
	t.Helper()
	disp := &fakeDispatcher{outcomes: map[string]job.Outcome{
		"2026-01": job.OutcomeAlreadyCompleted,
		"2026-02": job.OutcomeAlreadyOwned,
		"2026-03": job.OutcomeUnavailable,
		"2026-04": job.OutcomeFailed,
		"2026-05": job.OutcomeFailed,       // on the caller's input (BadInput)
		"2026-06": job.OutcomeFailed,       // transiently, not recorded
		"2026-07": job.OutcomeFailed,       // transiently, recorded for the resumer
		"2026-08": job.OutcomeAlreadyOwned, // and not recorded
		"2026-09": job.OutcomeAlreadyOwned, // and recorded for the resumer
	}}
	reg := prometheus.NewRegistry()
	logs := &testenv.Buffer{}
	cfg := httpapi.Config{
		Replica:    "r1",
		Tokens:     testTokens(),
		Log:        slog.New(slog.NewJSONHandler(logs, nil)),
		Kinds:      testKinds(t),
		Dispatcher: disp,
		Locks:      fakeLocks{locks: []ownership.LockInfo{{Key: "billrun:2026-11", Owner: "r1", Fence: 4, Holds: 1, TTL: 30 * time.Second}}},
		Metrics:    promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		Registerer: reg,
	}
	if mod != nil {
		mod(&cfg)
	}
	api, err := httpapi.New(cfg)
	require.NoError(t, err)
	return bundle{api: api, disp: disp, reg: reg, logs: logs}
}

type reply struct {
	code    int
	header  http.Header
	body    []byte
	problem httpapi.Problem
}

func (b bundle) do(t *testing.T, method, path, body string, hdr ...string) reply {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, rd)
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json") // as every client must
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	b.api.ServeHTTP(w, req)
	r := reply{code: w.Code, header: w.Header(), body: w.Body.Bytes()}
	if strings.HasPrefix(w.Header().Get("Content-Type"), httpapi.ProblemContentType) {
		require.NoError(t, json.Unmarshal(r.body, &r.problem), "problem body: %s", r.body)
		require.Equal(t, r.code, r.problem.Status)
		require.NotEmpty(t, r.problem.Code)
		require.NotEmpty(t, r.problem.Title)
		require.NotEmpty(t, r.problem.Type)
		require.Equal(t, r.header.Get("X-Request-Id"), r.problem.RequestID)
	}
	return r
}

func TestHealthz(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "GET", "/healthz", "", "Authorization", "")
	require.Equal(t, http.StatusOK, r.code)
	require.JSONEq(t, `{"status":"ok","replica":"r1"}`, string(r.body))
}

func TestReadyz(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "GET", "/readyz", "", "Authorization", "")
	require.Equal(t, http.StatusOK, r.code)
	require.JSONEq(t, `{"status":"ready","replica":"r1"}`, string(r.body))

	b.api.SetNotReady(httpapi.ConditionMigrations, "2 migrations pending: run `coordinator migrate up`")
	b.api.SetNotReady(httpapi.ConditionStarting, "the replica is starting")
	r = b.do(t, "GET", "/readyz", "", "Authorization", "")
	require.Equal(t, http.StatusServiceUnavailable, r.code)
	require.Equal(t, httpapi.CodeNotReady, r.problem.Code)
	require.Equal(t, "not ready: migrations, starting", r.problem.Detail)
	require.Equal(t, map[string]string{"migrations": "2 migrations pending: run `coordinator migrate up`",
		"starting": "the replica is starting"}, r.problem.Checks)

	b.api.SetReady(httpapi.ConditionStarting)
	b.api.SetReady(httpapi.ConditionMigrations)
	require.Equal(t, http.StatusOK, b.do(t, "GET", "/readyz", "").code)

	b.api.Drain()
	r = b.do(t, "GET", "/readyz", "")
	require.Equal(t, http.StatusServiceUnavailable, r.code)
	require.Equal(t, "not ready: shutting_down", r.problem.Detail)
	require.Equal(t, http.StatusOK, b.do(t, "GET", "/healthz", "").code, "liveness is not readiness")
}

type fakeHealth []health.Result

func (f fakeHealth) Snapshot() []health.Result { return f }

// /v1/health gives the detail /readyz leaves out, to a token with the read
// scope; readiness does not depend on it.
func TestHealth(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 3, 4, 5, 6, 0, time.UTC)
	deps := fakeHealth{
		{Name: "redis", Checked: true, OK: false, Error: "dial tcp 10.0.0.7:6380: connect: connection refused", CheckedAt: at, Since: at},
		{Name: "postgres", Checked: true, OK: true, CheckedAt: at, Since: at, DurationMS: 2},
	}
	b := setup(t, func(c *httpapi.Config) { c.Health = deps })
	require.Equal(t, http.StatusOK, b.do(t, "GET", "/readyz", "").code, "a dependency down does not make the replica unready")

	r := b.do(t, "GET", "/v1/health", "", "Authorization", "Bearer "+readToken)
	require.Equal(t, http.StatusOK, r.code, string(r.body))
	var rep httpapi.HealthReport
	require.NoError(t, json.Unmarshal(r.body, &rep))
	require.Equal(t, "degraded", rep.Status)
	require.True(t, rep.Ready)
	require.Equal(t, []health.Result(deps), rep.Dependencies)

	require.Equal(t, http.StatusUnauthorized, b.do(t, "GET", "/v1/health", "", "Authorization", "").code)
	require.Equal(t, http.StatusForbidden, b.do(t, "GET", "/v1/health", "", "Authorization", "Bearer "+mutateToken).code)

	ok := setup(t, func(c *httpapi.Config) { c.Health = fakeHealth{{Name: "redis", Checked: true, OK: true}} })
	r = ok.do(t, "GET", "/v1/health", "")
	require.NoError(t, json.Unmarshal(r.body, &rep))
	require.Equal(t, "ok", rep.Status)
}

func TestAuth(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	body := `{"period":"2026-11"}`
	cases := []struct {
		name, auth string
		code       int
		problem    string
	}{
		{"missing", "", http.StatusUnauthorized, httpapi.CodeUnauthorized},
		{"wrong scheme", "Basic " + token, http.StatusUnauthorized, httpapi.CodeUnauthorized},
		{"wrong token", "Bearer nope", http.StatusUnauthorized, httpapi.CodeUnauthorized},
		{"prefix of token", "Bearer " + token[:4], http.StatusUnauthorized, httpapi.CodeUnauthorized},
		{"token plus suffix", "Bearer " + token + "x", http.StatusUnauthorized, httpapi.CodeUnauthorized},
		{"right token", "Bearer " + token, http.StatusAccepted, ""},
		{"scheme case-insensitive", "bearer " + token, http.StatusAccepted, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := b.do(t, "POST", "/v1/billruns", body, "Authorization", c.auth)
			require.Equal(t, c.code, r.code, string(r.body))
			require.Equal(t, c.problem, r.problem.Code)
			if c.code == http.StatusUnauthorized {
				require.Equal(t, `Bearer realm="coordinator"`, r.header.Get("WWW-Authenticate"))
			}
		})
	}
	t.Run("every /v1 route is guarded", func(t *testing.T) {
		for _, rt := range [][2]string{{"POST", "/v1/billruns"}, {"GET", "/v1/billruns/2026-11"}, {"POST", "/v1/msisdn-reaper/sweeps"}, {"GET", "/v1/locks"}, {"GET", "/v1/health"}} {
			r := b.do(t, rt[0], rt[1], "", "Authorization", "")
			require.Equal(t, http.StatusUnauthorized, r.code, rt)
		}
	})
	t.Run("no token configured is 403", func(t *testing.T) {
		nb := setup(t, func(c *httpapi.Config) { c.Tokens = nil })
		for _, auth := range []string{"", "Bearer ", "Bearer " + token} {
			r := nb.do(t, "GET", "/v1/locks", "", "Authorization", auth)
			require.Equal(t, http.StatusForbidden, r.code)
			require.Equal(t, httpapi.CodeForbidden, r.problem.Code)
			require.Contains(t, r.problem.Detail, "COORDINATOR_ADMIN_TOKEN")
		}
	})
}

// GET /v1/* needs the read scope, POST /v1/* the mutate scope; a refusal
// is a warn log line that names the reason (and the token's name when it
// was valid), never the token.
func TestScopes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	reads := [][2]string{{"GET", "/v1/locks"}, {"GET", "/v1/billruns/2026-11"}, {"GET", "/v1/health"}}
	writes := [][3]string{{"POST", "/v1/billruns", `{"period":"2026-11"}`}, {"POST", "/v1/msisdn-reaper/sweeps", ""}}
	for _, rt := range reads {
		require.Equal(t, http.StatusOK, b.do(t, rt[0], rt[1], "", "Authorization", "Bearer "+readToken).code, rt)
		r := b.do(t, rt[0], rt[1], "", "Authorization", "Bearer "+mutateToken)
		require.Equal(t, http.StatusForbidden, r.code, rt)
		require.Equal(t, httpapi.CodeForbidden, r.problem.Code)
		require.Contains(t, r.problem.Detail, `the token "ci" has the scopes mutate`)
	}
	for _, rt := range writes {
		r := b.do(t, rt[0], rt[1], rt[2], "Authorization", "Bearer "+readToken)
		require.Equal(t, http.StatusForbidden, r.code, rt)
		require.Contains(t, r.problem.Detail, "needs mutate")
		require.Less(t, b.do(t, rt[0], rt[1], rt[2], "Authorization", "Bearer "+mutateToken).code, 300, rt)
		require.Less(t, b.do(t, rt[0], rt[1], rt[2], "Authorization", "Bearer "+token).code, 300, rt)
	}
	for _, e := range b.disp.triggers {
		require.NotEqual(t, "grafana", e.Principal, "a read token started nothing")
	}
	b.do(t, "GET", "/v1/locks", "", "Authorization", "Bearer wrong-token-that-is-long-enough-to-look-real")

	logs := b.logs.String()
	require.Contains(t, logs, `"level":"WARN","msg":"http_auth_failed","reason":"missing_scope","method":"POST","route":"POST /v1/billruns"`)
	require.Contains(t, logs, `"principal":"grafana"`)
	require.Contains(t, logs, `"msg":"http_auth_failed","reason":"invalid_token","method":"GET","route":"GET /v1/locks"`)
	for _, secret := range []string{token, readToken, mutateToken, "wrong-token-that-is-long-enough"} {
		require.NotContains(t, logs, secret, "no token in the log")
	}
	r := b.do(t, "GET", "/metrics", "")
	require.Contains(t, string(r.body), `coordinator_http_auth_failures_total{reason="missing_scope"} 5`)
	require.Contains(t, string(r.body), `coordinator_http_auth_failures_total{reason="invalid_token"} 1`)
}

// At the replica's cap on runs in flight, a POST is 429 with Retry-After.
func TestAtCapacity(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.disp.atCapacity = true
	for _, rt := range [][2]string{{"/v1/billruns", `{"period":"2026-11"}`}, {"/v1/msisdn-reaper/sweeps", ""}} {
		r := b.do(t, "POST", rt[0], rt[1])
		require.Equal(t, http.StatusTooManyRequests, r.code, string(r.body))
		require.Equal(t, httpapi.CodeTooManyRuns, r.problem.Code)
		require.Equal(t, fmt.Sprint(httpapi.RetryAfterAtCapacity), r.header.Get("Retry-After"))
		require.Contains(t, r.problem.Detail, "2 runs in flight")
		require.Contains(t, r.problem.Detail, "COORDINATOR_MAX_RUNS_IN_FLIGHT=2")
	}
}

func TestPostBillRun(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	t.Run("started", func(t *testing.T) {
		r := b.do(t, "POST", "/v1/billruns", `{"period":"2026-11"}`, "Content-Type", "application/json")
		require.Equal(t, http.StatusAccepted, r.code, string(r.body))
		require.Equal(t, "/v1/billruns/2026-11", r.header.Get("Location"))
		var got map[string]any
		require.NoError(t, json.Unmarshal(r.body, &got))
		require.Equal(t, "started", got["status"])
		require.Equal(t, "/v1/billruns/2026-11", got["status_url"])
		require.Equal(t, "billrun:2026-11", got["key"])
		require.Equal(t, "r1", got["owner"])
		require.EqualValues(t, 7, got["fence"])
		require.NotContains(t, got, "outcome", "a started run has no outcome yet")
		tr := b.disp.lastTrigger(t)
		require.Equal(t, job.SourceHTTP, tr.Source)
		require.Equal(t, r.header.Get("X-Request-Id"), tr.RequestID)
		require.Equal(t, "ops", tr.RequestedBy, "without requested_by in the body, the token's name")
		require.Equal(t, "ops", tr.Principal)
	})
	cases := []struct {
		name, body string
		code       int
		problem    string
		reason     string
		owner      string
		lockKey    string
	}{
		{"already completed", `{"period":"2026-01"}`, http.StatusOK, "", "", "", ""},
		{"already owned", `{"period":"2026-02"}`, http.StatusConflict, httpapi.CodeLockAcquisitionFailed, "already_owned", "r2", "billrun:2026-02"},
		{"unavailable", `{"period":"2026-03"}`, http.StatusServiceUnavailable, httpapi.CodeLockAcquisitionFailed, "unavailable", "", "billrun:2026-03"},
		{"failed", `{"period":"2026-04"}`, http.StatusInternalServerError, httpapi.CodeRunFailed, "failed", "", "billrun:2026-04"},
		{"failed on the caller's input", `{"period":"2026-05","adjust":true}`, http.StatusUnprocessableEntity, httpapi.CodeBadInput, "bad_input", "", "billrun:2026-05"},
		{"failed transiently, not recorded", `{"period":"2026-06"}`, http.StatusServiceUnavailable, httpapi.CodeBackendUnavailable, "failed", "", "billrun:2026-06"},
		{"failed transiently, recorded", `{"period":"2026-07"}`, http.StatusAccepted, "", "", "", ""},
		// Nothing owes an already_owned answer that was not recorded: if
		// the owner fails, no resumer knows of this request.
		{"already owned, not recorded", `{"period":"2026-08"}`, http.StatusServiceUnavailable, httpapi.CodeBackendUnavailable, "already_owned", "r2", "billrun:2026-08"},
		{"already owned, recorded", `{"period":"2026-09"}`, http.StatusConflict, httpapi.CodeLockAcquisitionFailed, "already_owned", "r2", "billrun:2026-09"},
		{"bad period", `{"period":"2026-13"}`, http.StatusBadRequest, httpapi.CodeBadInput, "bad_period", "", ""},
		{"missing period", `{}`, http.StatusBadRequest, httpapi.CodeBadInput, "missing_period", "", ""},
		{"empty body", ``, http.StatusBadRequest, httpapi.CodeBadInput, "missing_period", "", ""},
		{"unknown field", `{"period":"2026-11","dry_run":true}`, http.StatusBadRequest, httpapi.CodeBadInput, "malformed_json", "", ""},
		{"forced", `{"period":"2020-01","force":true}`, http.StatusAccepted, "", "", "", ""},
		{"too old", `{"period":"2020-01"}`, http.StatusBadRequest, httpapi.CodeBadInput, billrun.ReasonPeriodTooOld, "", ""},
		{"open period", `{"period":"2026-12"}`, http.StatusUnprocessableEntity, httpapi.CodeBadInput, billrun.ReasonPeriodNotClosed, "", ""},
		{"open period forced", `{"period":"2026-12","force":true}`, http.StatusUnprocessableEntity, httpapi.CodeBadInput, billrun.ReasonPeriodNotClosed, "", ""},
		{"future period", `{"period":"2999-12"}`, http.StatusUnprocessableEntity, httpapi.CodeBadInput, billrun.ReasonPeriodNotClosed, "", ""},
		{"trailing data", `{"period":"2026-11"} {}`, http.StatusBadRequest, httpapi.CodeBadInput, "", "", ""},
		{"not an object", `["2026-11"]`, http.StatusBadRequest, httpapi.CodeBadInput, "", "", ""},
		{"period not a string", `{"period":202611}`, http.StatusBadRequest, httpapi.CodeBadInput, "malformed_json", "", ""},
		// A member given twice was decoded last-wins: which one a reader
		// keeps is not defined by JSON, so neither is taken.
		{"duplicate member", `{"period":"2026-11","period":"2026-10"}`, http.StatusBadRequest, httpapi.CodeBadInput, "duplicate_key", "", ""},
		{"duplicate envelope member", `{"period":"2026-11","request_id":"a","request_id":"b"}`, http.StatusBadRequest, httpapi.CodeBadInput, "duplicate_key", "", ""},
		{"bad request_id", `{"period":"2026-11","request_id":"a b"}`, http.StatusBadRequest, httpapi.CodeBadInput, "", "", ""},
		{"too large", `{"period":"2026-11","requested_by":"` + strings.Repeat("x", 70<<10) + `"}`, http.StatusRequestEntityTooLarge, httpapi.CodePayloadTooLarge, "", "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := b.do(t, "POST", "/v1/billruns", c.body)
			require.Equal(t, c.code, r.code, string(r.body))
			require.Equal(t, c.problem, r.problem.Code)
			require.Equal(t, c.reason, r.problem.Reason)
			require.Equal(t, c.owner, r.problem.Owner)
			require.Equal(t, c.lockKey, r.problem.LockKey)
			if c.problem != "" {
				require.NotEmpty(t, r.problem.Detail)
				require.Equal(t, "/v1/billruns", r.problem.Instance)
			}
			if c.owner != "" {
				require.Contains(t, r.problem.Detail, c.owner)
			}
			if c.code == http.StatusServiceUnavailable {
				require.Equal(t, "5", r.header.Get("Retry-After"))
				require.True(t, r.problem.Retryable, "a 503 says it is retryable")
			} else {
				require.False(t, r.problem.Retryable)
			}
		})
	}
	t.Run("deferred", func(t *testing.T) {
		r := b.do(t, "POST", "/v1/billruns", `{"period":"2026-07"}`)
		require.Equal(t, http.StatusAccepted, r.code, string(r.body))
		var got map[string]any
		require.NoError(t, json.Unmarshal(r.body, &got))
		require.Equal(t, "deferred", got["status"], "recorded: the resumer owes the run")
		require.Equal(t, true, got["deferred"])
		require.Equal(t, true, got["retryable"])
		require.Empty(t, r.header.Get("Location"))
	})
	t.Run("not recorded says so", func(t *testing.T) {
		r := b.do(t, "POST", "/v1/billruns", `{"period":"2026-06"}`)
		require.Contains(t, r.problem.Detail, "not recorded")
		require.Contains(t, r.problem.Detail, "connection refused")
	})
	t.Run("wrong content type", func(t *testing.T) {
		r := b.do(t, "POST", "/v1/billruns", `period=2026-11`, "Content-Type", "application/x-www-form-urlencoded")
		require.Equal(t, http.StatusUnsupportedMediaType, r.code)
		require.Equal(t, httpapi.CodeUnsupportedMediaType, r.problem.Code)
	})
	// A body is JSON and says so: without a Content-Type it was taken as
	// JSON (the contract says 415). An empty body needs none.
	t.Run("a body without a content type", func(t *testing.T) {
		r := b.do(t, "POST", "/v1/billruns", `{"period":"2026-11"}`, "Content-Type", "")
		require.Equal(t, http.StatusUnsupportedMediaType, r.code, string(r.body))
		require.Equal(t, httpapi.CodeUnsupportedMediaType, r.problem.Code)
		require.Contains(t, r.problem.Detail, "application/json")
		require.Equal(t, http.StatusOK, b.do(t, "POST", "/v1/msisdn-reaper/sweeps", "").code, "an empty body")
	})
	t.Run("dispatcher refusal is a 503", func(t *testing.T) {
		nb := setup(t, nil)
		nb.disp.err = errors.New("trigger: dispatcher shutting down")
		nb.disp.errOutcome = job.OutcomeUnavailable
		r := nb.do(t, "POST", "/v1/billruns", `{"period":"2026-11"}`)
		require.Equal(t, http.StatusServiceUnavailable, r.code)
		require.Equal(t, httpapi.CodeShuttingDown, r.problem.Code)
	})
	t.Run("dispatcher error is a 500 without internals", func(t *testing.T) {
		nb := setup(t, nil)
		nb.disp.err = errors.New("secret internal detail")
		r := nb.do(t, "POST", "/v1/billruns", `{"period":"2026-11"}`)
		require.Equal(t, http.StatusInternalServerError, r.code)
		require.NotContains(t, string(r.body), "secret")
	})
}

func TestRequestID(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "POST", "/v1/billruns", `{"period":"2026-11"}`, "X-Request-Id", "req-123")
	require.Equal(t, "req-123", r.header.Get("X-Request-Id"))
	require.Equal(t, "req-123", b.disp.lastTrigger(t).RequestID)

	r = b.do(t, "POST", "/v1/billruns", `{"period":"2026-11","request_id":"body-id","requested_by":"ops"}`, "X-Request-Id", "req-123")
	require.Equal(t, "req-123", r.header.Get("X-Request-Id"))
	require.Equal(t, job.Trigger{Source: job.SourceHTTP, RequestID: "body-id", RequestedBy: "ops", Principal: "ops"}, b.disp.lastTrigger(t))
	r = b.do(t, "POST", "/v1/billruns", `{"period":"2026-11","requested_by":"alice"}`, "Authorization", "Bearer "+mutateToken)
	require.Equal(t, http.StatusAccepted, r.code)
	require.Equal(t, "alice", b.disp.lastTrigger(t).RequestedBy, "the body's requested_by is recorded")
	require.Equal(t, "ci", b.disp.lastTrigger(t).Principal, "and the token's name beside it, whatever the body says")

	r = b.do(t, "POST", "/v1/billruns", `{"period":"2026-11"}`, "X-Request-Id", "bad id\x01")
	got := r.header.Get("X-Request-Id")
	require.Regexp(t, `^[0-9a-f]{32}$`, got)
	require.Equal(t, got, b.disp.lastTrigger(t).RequestID)
}

func TestDraining(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.api.Drain()
	for _, path := range []string{"/v1/billruns", "/v1/msisdn-reaper/sweeps"} {
		r := b.do(t, "POST", path, `{"period":"2026-11"}`)
		require.Equal(t, http.StatusServiceUnavailable, r.code)
		require.Equal(t, httpapi.CodeShuttingDown, r.problem.Code)
		require.Equal(t, "5", r.header.Get("Retry-After"))
	}
	b.disp.mu.Lock()
	require.Empty(t, b.disp.triggers, "no work reaches the dispatcher while draining")
	b.disp.mu.Unlock()
	// Reads still answer.
	require.Equal(t, http.StatusOK, b.do(t, "GET", "/v1/locks", "").code)
	require.Equal(t, http.StatusOK, b.do(t, "GET", "/healthz", "").code)
}

func TestGetBillRun(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "GET", "/v1/billruns/2026-11", "")
	require.Equal(t, http.StatusOK, r.code)
	require.JSONEq(t, `{"period":"2026-11","status":"COMPLETED","owner":"r1","fence":2}`, string(r.body))

	r = b.do(t, "GET", "/v1/billruns/2026-10", "")
	require.Equal(t, http.StatusNotFound, r.code)
	require.Equal(t, httpapi.CodeNotFound, r.problem.Code)

	r = b.do(t, "GET", "/v1/billruns/2026-13", "")
	require.Equal(t, http.StatusBadRequest, r.code)
	require.Equal(t, httpapi.CodeBadInput, r.problem.Code)

	r = b.do(t, "GET", "/v1/billruns/2026-12", "")
	require.Equal(t, http.StatusServiceUnavailable, r.code)
	require.Equal(t, httpapi.CodeBackendUnavailable, r.problem.Code)
}

func TestLocks(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "GET", "/v1/locks", "")
	require.Equal(t, http.StatusOK, r.code)
	require.JSONEq(t, `{"locks":[{"key":"billrun:2026-11","owner":"r1","fence":4,"holds":1,"ttl_ns":30000000000,"waiters":0}]}`, string(r.body))

	nb := setup(t, func(c *httpapi.Config) { c.Locks = fakeLocks{err: errors.New("redis down")} })
	r = nb.do(t, "GET", "/v1/locks", "")
	require.Equal(t, http.StatusServiceUnavailable, r.code)
	require.Equal(t, httpapi.CodeBackendUnavailable, r.problem.Code)

	eb := setup(t, func(c *httpapi.Config) { c.Locks = fakeLocks{} })
	r = eb.do(t, "GET", "/v1/locks", "")
	require.JSONEq(t, `{"locks":[]}`, string(r.body))
}

func TestSweep(t *testing.T) {
	t.Parallel()
	cases := []struct {
		outcome job.Outcome
		code    int
		problem string
		owner   string
	}{
		{job.OutcomeCompleted, http.StatusOK, "", ""},
		{job.OutcomeAlreadyOwned, http.StatusConflict, httpapi.CodeLockAcquisitionFailed, "r3"},
		{job.OutcomeUnavailable, http.StatusServiceUnavailable, httpapi.CodeLockAcquisitionFailed, ""},
		{job.OutcomeLost, http.StatusServiceUnavailable, httpapi.CodeOwnershipLost, ""},
		{job.OutcomeFailed, http.StatusInternalServerError, httpapi.CodeRunFailed, ""},
		{"failed_transiently", http.StatusServiceUnavailable, httpapi.CodeBackendUnavailable, ""},
	}
	for _, c := range cases {
		t.Run(string(c.outcome), func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			b.disp.sweep = c.outcome
			if c.outcome == "failed_transiently" { // a failure of a transient cause: never a 500
				b.disp.sweep, b.disp.sweepRetryable = job.OutcomeFailed, true
			}
			r := b.do(t, "POST", "/v1/msisdn-reaper/sweeps", "")
			require.Equal(t, c.code, r.code, string(r.body))
			require.Equal(t, c.problem, r.problem.Code)
			require.Equal(t, c.owner, r.problem.Owner)
			require.Equal(t, c.code == http.StatusServiceUnavailable, r.problem.Retryable)
			if c.code == http.StatusServiceUnavailable {
				require.Equal(t, "5", r.header.Get("Retry-After"))
			}
			if c.problem != "" {
				require.Equal(t, "msisdn-reaper:sweep", r.problem.LockKey)
			} else {
				var res job.Result
				require.NoError(t, json.Unmarshal(r.body, &res))
				require.EqualValues(t, 3, res.Counts["freed"])
			}
			require.Equal(t, job.SourceHTTP, b.disp.lastTrigger(t).Source)
		})
	}
	t.Run("body ids and bad bodies", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		r := b.do(t, "POST", "/v1/msisdn-reaper/sweeps", `{"request_id":"sw-1","requested_by":"ops"}`)
		require.Equal(t, http.StatusOK, r.code)
		require.Equal(t, "sw-1", b.disp.lastTrigger(t).RequestID)
		r = b.do(t, "POST", "/v1/msisdn-reaper/sweeps", `{"period":"2026-11"}`)
		require.Equal(t, http.StatusBadRequest, r.code)
		require.Contains(t, r.problem.Detail, "unknown field")
	})
}

func TestNotFoundAndMethod(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	r := b.do(t, "GET", "/v2/nothing", "")
	require.Equal(t, http.StatusNotFound, r.code)
	require.Equal(t, httpapi.CodeNotFound, r.problem.Code)

	r = b.do(t, "GET", "/v1/billruns", "")
	require.Equal(t, http.StatusMethodNotAllowed, r.code)
	require.Equal(t, httpapi.CodeMethodNotAllowed, r.problem.Code)
	require.Equal(t, "POST", r.header.Get("Allow"))

	r = b.do(t, "DELETE", "/v1/locks", "")
	require.Equal(t, http.StatusMethodNotAllowed, r.code)
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.do(t, "POST", "/v1/billruns", `{"period":"2026-02"}`)
	r := b.do(t, "GET", "/metrics", "")
	require.Equal(t, http.StatusOK, r.code)
	require.Contains(t, string(r.body), `coordinator_http_requests_total{code="409",method="POST",route="POST /v1/billruns"} 1`)
}

// Whatever method a client sends, the method label is one of a fixed set,
// and the route is the pattern, never the path: on a real listener.
func TestMetricLabelsAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	srv := httptest.NewServer(b.api)
	defer srv.Close()
	send := func(method, path string) {
		req, err := http.NewRequest(method, srv.URL+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
	}
	for i := range 40 {
		send(fmt.Sprintf("GARBAGE%d", i), "/v1/locks")
		send("GET", fmt.Sprintf("/v1/billruns/2026-%02d", i%12+1))
		send("GET", fmt.Sprintf("/no/such/path/%d", i))
	}
	send("BREW", "/healthz")
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	methods, routes := map[string]bool{}, map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "coordinator_http_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "method":
					methods[l.GetValue()] = true
				case "route":
					routes[l.GetValue()] = true
				}
			}
		}
	}
	require.Equal(t, map[string]bool{"GET": true, "other": true}, methods)
	require.Equal(t, map[string]bool{"/v1/locks": true, "GET /v1/billruns/{id}": true, "/": true, "/healthz": true}, routes)
	r := b.do(t, "GET", "/metrics", "")
	require.Contains(t, string(r.body), `coordinator_http_requests_total{code="405",method="other",route="/v1/locks"} 40`)
	require.NotContains(t, string(r.body), "GARBAGE")
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	_, err := httpapi.New(httpapi.Config{})
	require.ErrorContains(t, err, "Dispatcher")
	_, err = httpapi.New(httpapi.Config{Dispatcher: &fakeDispatcher{}})
	require.ErrorContains(t, err, "Kinds")
	_, err = httpapi.New(httpapi.Config{Dispatcher: &fakeDispatcher{}, Kinds: testKinds(t),
		Tokens: []adminauth.Token{{Name: "x", Scopes: adminauth.All, Secret: "CHANGE-ME"}}})
	require.ErrorContains(t, err, "at least 32 bytes")
	require.NotContains(t, err.Error(), "CHANGE-ME")
}

func TestServer(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	srv := httpapi.NewServer("127.0.0.1:0", b.api, nil)
	require.NoError(t, srv.Stop(context.Background()), "stop before start is a no-op")
	srv = httpapi.NewServer("127.0.0.1:0", b.api, nil)
	require.NoError(t, srv.Start(context.Background()))
	require.Error(t, srv.Start(context.Background()))
	url := fmt.Sprintf("http://%s/healthz", srv.Addr())
	resp, err := http.Get(url)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, srv.Stop(ctx))
	require.NoError(t, srv.Stop(ctx))
	http.DefaultClient.CloseIdleConnections()
	_, err = http.Get(url)
	require.Error(t, err, "stopped server refuses connections")
}

// A period that has not ended in the billing zone is refused with 422, forced
// or not, and the problem names the period, the zone and the end; nothing is
// dispatched.
func TestPostBillRunOpenPeriodIs422(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for _, body := range []string{`{"period":"2026-12"}`, `{"period":"2026-12","force":true}`, `{"period":"2027-01","adjust":true}`} {
		r := b.do(t, "POST", "/v1/billruns", body)
		require.Equal(t, http.StatusUnprocessableEntity, r.code, string(r.body))
		require.Equal(t, httpapi.ProblemContentType, r.header.Get("Content-Type"))
		require.Equal(t, billrun.ReasonPeriodNotClosed, r.problem.Reason)
		require.Equal(t, "UTC", r.problem.Fields["zone"])
		require.Contains(t, r.problem.Detail, r.problem.Fields["period"])
		require.Contains(t, r.problem.Detail, "UTC")
	}
	r := b.do(t, "POST", "/v1/billruns", `{"period":"2026-12"}`)
	require.Equal(t, "2026-12", r.problem.Fields["period"])
	require.Equal(t, "2027-01-01T00:00:00Z", r.problem.Fields["period_end"])
	require.Empty(t, b.disp.triggers, "nothing was dispatched")
}

// Every reason of coordinator_http_auth_failures_total is at 0 before the
// first refusal, so CoordinatorAdminAuthFailures' increase() counts a burst
// right after a replica starts (a series first seen at 1 would lose one).
func TestAuthFailureSeriesExistAtZero(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	n, err := testutil.GatherAndCount(b.reg, "coordinator_http_auth_failures_total")
	require.NoError(t, err)
	require.Equal(t, 4, n, "disabled, missing_token, invalid_token, missing_scope")
	require.NoError(t, testutil.GatherAndCompare(b.reg, strings.NewReader(`
# HELP coordinator_http_auth_failures_total Admin API requests refused by authentication or authorization, by reason.
# TYPE coordinator_http_auth_failures_total counter
coordinator_http_auth_failures_total{reason="disabled"} 0
coordinator_http_auth_failures_total{reason="invalid_token"} 0
coordinator_http_auth_failures_total{reason="missing_scope"} 0
coordinator_http_auth_failures_total{reason="missing_token"} 0
`), "coordinator_http_auth_failures_total"))
}

// The console's action goes through the POST handler itself: the same
// answers, the principal recorded.
func TestTriggerAnswersLikeThePost(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := context.Background()
	code, ctype, body := b.api.Trigger(ctx, "console-ops", "/v1/billruns", []byte(`{"period":"2026-11"}`))
	require.Equal(t, http.StatusAccepted, code, string(body))
	require.Equal(t, "application/json", ctype)
	require.Contains(t, string(body), `"status":"started"`)
	tr := b.disp.lastTrigger(t)
	require.Equal(t, job.SourceHTTP, tr.Source)
	require.Equal(t, "console-ops", tr.Principal)
	require.Equal(t, "console-ops", tr.RequestedBy)
	require.NotEmpty(t, tr.RequestID)

	code, ctype, body = b.api.Trigger(ctx, "console-ops", "/v1/billruns", []byte(`{"period":"2026-02"}`))
	require.Equal(t, http.StatusConflict, code)
	require.Equal(t, "application/problem+json", ctype)
	require.Contains(t, string(body), `"owner":"r2"`)
	require.Contains(t, string(body), `"reason":"already_owned"`)

	code, _, _ = b.api.Trigger(ctx, "console-ops", "/v1/billruns", []byte(`{"period":"2026-13"}`))
	require.Equal(t, http.StatusBadRequest, code)
	code, _, _ = b.api.Trigger(ctx, "console-ops", "/v1/nothing", nil)
	require.Equal(t, http.StatusNotFound, code)
}

// Every /ui path is the console's to answer, /ui itself included: its
// answers carry the console's security headers (CSP on redirects too).
func TestEveryUIPathGoesToTheConsole(t *testing.T) {
	t.Parallel()
	var seen []string
	b := setup(t, func(c *httpapi.Config) {
		c.Console = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen = append(seen, r.Method+" "+r.URL.Path)
			w.Header().Set("Content-Security-Policy", "default-src 'none'")
			http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
		})
	})
	for _, p := range []string{"/ui", "/ui/", "/ui/locks"} {
		for _, m := range []string{"GET", "POST"} {
			r := b.do(t, m, p, "")
			require.Equal(t, "default-src 'none'", r.header.Get("Content-Security-Policy"), "%s %s", m, p)
		}
	}
	require.Len(t, seen, 6)
}

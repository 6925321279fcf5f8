package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/httpapi"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/msisdnreaper"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const token = "s3cret-token"

var periodRE = regexp.MustCompile(`^2[0-9]{3}-(0[1-9]|1[0-2])$`)

// testKinds are the real bill-run and sweep kinds: the API decodes their
// bodies as in production.
func testKinds(t testing.TB) *owned.Registry {
	reg, err := owned.NewRegistry(billrun.New(billrun.Config{}), msisdnreaper.NewSweepKind(msisdnreaper.Config{}))
	require.NoError(t, err)
	return reg
}

// fakeDispatcher stands in for trigger.Dispatcher behind the API's own
// interface. Bill-run outcomes are chosen per period; it records the
// triggers.
type fakeDispatcher struct {
	mu         sync.Mutex
	outcomes   map[string]job.Outcome
	sweep      job.Outcome
	err        error
	errOutcome job.Outcome
	triggers   []job.Trigger
}

func (f *fakeDispatcher) Start(_ context.Context, k owned.Kind, p owned.Params, t job.Trigger) (job.Result, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.triggers = append(f.triggers, t)
	if f.err != nil {
		return job.Result{Outcome: f.errOutcome}, false, f.err
	}
	period := p.(billrun.Period).String()
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
	case job.OutcomeUnavailable:
		res.Error = "dial tcp 127.0.0.1:1: connection refused"
	case job.OutcomeFailed:
		res.Error = "batch 3: boom"
	}
	return res, false, nil
}

func (f *fakeDispatcher) Run(_ context.Context, k owned.Kind, p owned.Params, t job.Trigger) (job.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.triggers = append(f.triggers, t)
	if f.err != nil {
		return job.Result{Outcome: f.errOutcome}, f.err
	}
	res := job.Result{Job: k.Spec().Name, Key: k.LockKey(p), Replica: "r1", Outcome: cmpOutcome(f.sweep), RequestID: t.RequestID}
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
}

func setup(t *testing.T, mod func(*httpapi.Config)) bundle {
	t.Helper()
	disp := &fakeDispatcher{outcomes: map[string]job.Outcome{
		"2026-01": job.OutcomeAlreadyCompleted,
		"2026-02": job.OutcomeAlreadyOwned,
		"2026-03": job.OutcomeUnavailable,
		"2026-04": job.OutcomeFailed,
	}}
	reg := prometheus.NewRegistry()
	cfg := httpapi.Config{
		Replica:    "r1",
		Token:      token,
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
	return bundle{api: api, disp: disp, reg: reg}
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
	ok := func(context.Context) error { return nil }
	t.Run("all ok", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *httpapi.Config) {
			c.Checks = []httpapi.Check{{Name: "redis", Check: ok}, {Name: "postgres", Check: ok}}
		})
		r := b.do(t, "GET", "/readyz", "")
		require.Equal(t, http.StatusOK, r.code)
		require.JSONEq(t, `{"status":"ready","replica":"r1","checks":{"redis":"ok","postgres":"ok"}}`, string(r.body))
	})
	t.Run("names each failing dependency", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *httpapi.Config) {
			// The kafka check below waits for the bound; the others must beat
			// it, by far, however busy the machine.
			c.CheckTimeout = 2 * time.Second
			c.Checks = []httpapi.Check{
				{Name: "redis", Check: func(context.Context) error { return errors.New("dial 127.0.0.1:6379: refused") }},
				{Name: "postgres", Check: ok},
				{Name: "kafka", Check: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }},
				{Name: "panicky", Check: func(context.Context) error { panic("boom") }},
			}
		})
		r := b.do(t, "GET", "/readyz", "")
		require.Equal(t, http.StatusServiceUnavailable, r.code)
		require.Equal(t, httpapi.CodeNotReady, r.problem.Code)
		require.Contains(t, r.problem.Detail, "redis: dial 127.0.0.1:6379: refused")
		require.Contains(t, r.problem.Detail, "kafka: ")
		require.Contains(t, r.problem.Detail, "panicky: check panicked: boom")
		require.NotContains(t, r.problem.Detail, "postgres")
		require.Equal(t, "ok", r.problem.Checks["postgres"])
		require.Contains(t, r.problem.Checks["kafka"], "deadline exceeded")
	})
	t.Run("draining", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *httpapi.Config) { c.Checks = []httpapi.Check{{Name: "redis", Check: ok}} })
		b.api.Drain()
		r := b.do(t, "GET", "/readyz", "")
		require.Equal(t, http.StatusServiceUnavailable, r.code)
		require.Contains(t, r.problem.Detail, "shutting down")
	})
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
		for _, rt := range [][2]string{{"POST", "/v1/billruns"}, {"GET", "/v1/billruns/2026-11"}, {"POST", "/v1/msisdn-reaper/sweeps"}, {"GET", "/v1/locks"}} {
			r := b.do(t, rt[0], rt[1], "", "Authorization", "")
			require.Equal(t, http.StatusUnauthorized, r.code, rt)
		}
	})
	t.Run("no token configured is 403", func(t *testing.T) {
		nb := setup(t, func(c *httpapi.Config) { c.Token = "" })
		for _, auth := range []string{"", "Bearer ", "Bearer " + token} {
			r := nb.do(t, "GET", "/v1/locks", "", "Authorization", auth)
			require.Equal(t, http.StatusForbidden, r.code)
			require.Equal(t, httpapi.CodeForbidden, r.problem.Code)
			require.Contains(t, r.problem.Detail, "COORDINATOR_ADMIN_TOKEN")
		}
	})
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
		require.Equal(t, "http", tr.RequestedBy)
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
		{"bad period", `{"period":"2026-13"}`, http.StatusBadRequest, httpapi.CodeBadInput, "", "", ""},
		{"missing period", `{}`, http.StatusBadRequest, httpapi.CodeBadInput, "", "", ""},
		{"empty body", ``, http.StatusBadRequest, httpapi.CodeBadInput, "", "", ""},
		{"unknown field", `{"period":"2026-11","force":true}`, http.StatusBadRequest, httpapi.CodeBadInput, "", "", ""},
		{"trailing data", `{"period":"2026-11"} {}`, http.StatusBadRequest, httpapi.CodeBadInput, "", "", ""},
		{"not an object", `["2026-11"]`, http.StatusBadRequest, httpapi.CodeBadInput, "", "", ""},
		{"period not a string", `{"period":202611}`, http.StatusBadRequest, httpapi.CodeBadInput, "", "", ""},
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
				require.NotEmpty(t, r.header.Get("Retry-After"))
			}
		})
	}
	t.Run("wrong content type", func(t *testing.T) {
		r := b.do(t, "POST", "/v1/billruns", `period=2026-11`, "Content-Type", "application/x-www-form-urlencoded")
		require.Equal(t, http.StatusUnsupportedMediaType, r.code)
		require.Equal(t, httpapi.CodeUnsupportedMediaType, r.problem.Code)
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
	require.Equal(t, job.Trigger{Source: job.SourceHTTP, RequestID: "body-id", RequestedBy: "ops"}, b.disp.lastTrigger(t))

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
	require.JSONEq(t, `{"locks":[{"key":"billrun:2026-11","owner":"r1","fence":4,"holds":1,"ttl_ns":30000000000}]}`, string(r.body))

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
	}
	for _, c := range cases {
		t.Run(string(c.outcome), func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			b.disp.sweep = c.outcome
			r := b.do(t, "POST", "/v1/msisdn-reaper/sweeps", "")
			require.Equal(t, c.code, r.code, string(r.body))
			require.Equal(t, c.problem, r.problem.Code)
			require.Equal(t, c.owner, r.problem.Owner)
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

func TestNewValidates(t *testing.T) {
	t.Parallel()
	_, err := httpapi.New(httpapi.Config{})
	require.ErrorContains(t, err, "Dispatcher")
	_, err = httpapi.New(httpapi.Config{Dispatcher: &fakeDispatcher{}})
	require.ErrorContains(t, err, "Kinds")
	_, err = httpapi.New(httpapi.Config{Dispatcher: &fakeDispatcher{}, Kinds: testKinds(t), Checks: []httpapi.Check{{Name: "x"}}})
	require.ErrorContains(t, err, `"x"`)
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

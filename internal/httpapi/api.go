// Package httpapi is the coordinator's admin HTTP API: health and readiness,
// Prometheus metrics, list held locks, and for every registered kind of
// owned run with an HTTP path (owned.Spec.HTTPPath): POST to start a run,
// and GET {path}/{id} for a kind with run ids (owned.StatusKind).
//
// Errors are RFC 9457 problem documents (application/problem+json) with the
// ADR-024 members code, reason, lockKey and owner where they apply. /v1/*
// needs `Authorization: Bearer <COORDINATOR_ADMIN_TOKEN>`, compared in
// constant time; with no token configured /v1/* answers 403.
//
// Status codes of a POST: 200 completed or already completed, 409 already
// owned (owner named), 503 lock backend unavailable, ownership lost mid-run
// or shutting down, 400 bad input, 401/403 auth, 500 the run failed. A kind
// with HTTPAsync (bill runs) answers 202 as soon as the run is owned and
// claimed; Location names the status URL. The others wait for the outcome,
// bounded by SyncTimeout.
package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// Dispatcher is the part of trigger.Dispatcher the API drives. Its errors
// mean the work was refused (the replica is shutting down).
type Dispatcher interface {
	// Run runs one owned run to its end.
	Run(ctx context.Context, k owned.Kind, p owned.Params, t job.Trigger) (job.Result, error)
	// Start takes the lock (and claim) synchronously; started=true means the
	// run goes on in the background and res names the owner and fence.
	// Otherwise res is final.
	Start(ctx context.Context, k owned.Kind, p owned.Params, t job.Trigger) (res job.Result, started bool, err error)
	// Status returns a run's state as a JSON-encodable value: an error
	// wrapping job.ErrBadInput for an id that can never exist,
	// owned.ErrNotFound when there is no such run, anything else means the
	// store could not answer.
	Status(ctx context.Context, k owned.Kind, id string) (any, error)
}

// Check is one readiness dependency. Check returns nil when the dependency
// is usable; its error text is shown in /readyz.
type Check struct {
	Name  string
	Check func(ctx context.Context) error
}

// Config wires the API. Dispatcher is required.
type Config struct {
	// Replica is this replica's id (shown in /healthz and /readyz).
	Replica string
	// Token guards /v1/*. Empty: /v1/* answers 403.
	Token string
	// Kinds are the kinds of owned run with routes. Required.
	Kinds *owned.Registry
	// Dispatcher runs them. Required.
	Dispatcher Dispatcher
	// Locks answers GET /v1/locks. Nil: an empty list.
	Locks ownership.Inspector
	// Checks are run by /readyz, concurrently, each bounded by CheckTimeout.
	Checks []Check
	// CheckTimeout bounds one readiness check. Default 2s.
	CheckTimeout time.Duration
	// Metrics serves GET /metrics (promhttp.HandlerFor). Nil: 404.
	Metrics http.Handler
	// MaxBodyBytes bounds a request body. Default 64 KiB.
	MaxBodyBytes int64
	// SyncTimeout bounds a synchronous run request (a kind without
	// HTTPAsync). Default 2m.
	SyncTimeout time.Duration
	// Log receives one line per request (debug) and per failure (warn).
	Log *slog.Logger
	// Registerer gets coordinator_http_requests_total and
	// coordinator_http_request_duration_seconds. Nil: not registered.
	Registerer prometheus.Registerer
}

// API is the admin HTTP handler.
type API struct {
	cfg      Config
	token    [32]byte
	log      *slog.Logger
	mux      *http.ServeMux
	draining atomic.Bool

	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// New builds the API; it validates cfg.
func New(cfg Config) (*API, error) {
	if cfg.Dispatcher == nil || cfg.Kinds == nil {
		return nil, errors.New("httpapi: Config.Dispatcher and Config.Kinds are required")
	}
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = 2 * time.Second
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.SyncTimeout <= 0 {
		cfg.SyncTimeout = 2 * time.Minute
	}
	for _, c := range cfg.Checks {
		if c.Name == "" || c.Check == nil {
			return nil, fmt.Errorf("httpapi: readiness check %q needs a name and a func", c.Name)
		}
	}
	a := &API{cfg: cfg, log: cfg.Log, mux: http.NewServeMux()}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	a.token = sha256.Sum256([]byte(cfg.Token))
	a.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "coordinator_http_requests_total",
		Help: "Admin API requests by route, method and status code.",
	}, []string{"route", "method", "code"})
	a.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "coordinator_http_request_duration_seconds",
		Help:    "Admin API request duration by route.",
		Buckets: prometheus.DefBuckets,
	}, []string{"route"})
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{a.requests, a.duration} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("httpapi: register metrics: %w", err)
			}
		}
	}
	a.routes()
	return a, nil
}

// Drain makes the API refuse new work (POST /v1/* answers 503
// SHUTTING_DOWN) and /readyz fail, while reads, health and metrics go on.
func (a *API) Drain() { a.draining.Store(true) }

// Draining reports whether Drain was called.
func (a *API) Draining() bool { return a.draining.Load() }

// ServeHTTP makes API an http.Handler.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.instrument(a.mux).ServeHTTP(w, r) }

func (a *API) routes() {
	m := a.mux
	m.HandleFunc("GET /healthz", a.healthz)
	m.HandleFunc("GET /readyz", a.readyz)
	if a.cfg.Metrics != nil {
		m.Handle("GET /metrics", a.cfg.Metrics)
	}
	m.Handle("GET /v1/locks", a.auth(a.getLocks))
	// Other methods on known paths: 405 as a problem document.
	allowed := map[string]string{"/healthz": "GET, HEAD", "/readyz": "GET, HEAD", "/v1/locks": "GET, HEAD"}
	for _, k := range a.cfg.Kinds.Kinds() {
		path := k.Spec().HTTPPath
		if path == "" {
			continue
		}
		m.Handle("POST "+path, a.auth(a.postRun(k)))
		allowed[path] = "POST"
		if _, ok := k.(owned.StatusKind); ok {
			m.Handle("GET "+path+"/{id}", a.auth(a.getStatus(k)))
			allowed[path+"/{id}"] = "GET, HEAD"
		}
	}
	if a.cfg.Metrics != nil {
		allowed["/metrics"] = "GET, HEAD"
	}
	for path, allow := range allowed {
		m.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allow)
			writeProblem(w, r, newProblem(http.StatusMethodNotAllowed, CodeMethodNotAllowed,
				fmt.Sprintf("%s is not allowed on %s (allowed: %s)", r.Method, r.URL.Path, allow)), 0)
		})
	}
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, newProblem(http.StatusNotFound, CodeNotFound, "no such resource"), 0)
	})
}

type ctxKey int

const requestIDKey ctxKey = 0

func requestIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey).(string)
	return id
}

// statusRecorder remembers the status code a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// instrument assigns the request id (X-Request-Id when usable, else a new
// one), echoes it, and records metrics and one log line per request.
func (a *API) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := r.Header.Get("X-Request-Id")
		if !validRequestID(id) {
			id = events.NewID()
		}
		w.Header().Set("X-Request-Id", id)
		r = r.WithContext(context.WithValue(r.Context(), requestIDKey, id))
		rec := &statusRecorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		a.requests.WithLabelValues(route, r.Method, fmt.Sprint(rec.status)).Inc()
		a.duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
		level := slog.LevelDebug
		if rec.status >= 500 {
			level = slog.LevelWarn
		}
		a.log.Log(r.Context(), level, "http_request", "method", r.Method, "route", route,
			"status", rec.status, "duration_ms", time.Since(start).Milliseconds(), "request_id", id)
	})
}

// auth guards /v1/*: 403 with no token configured, 401 for a missing or
// wrong bearer token. The comparison hashes both sides first so that it is
// constant-time in the token's length as well as its content.
func (a *API) auth(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.cfg.Token == "" {
			writeProblem(w, r, newProblem(http.StatusForbidden, CodeForbidden,
				"the admin API is disabled: COORDINATOR_ADMIN_TOKEN is not set"), 0)
			return
		}
		const scheme = "bearer "
		h := r.Header.Get("Authorization")
		if len(h) < len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) {
			writeProblem(w, r, newProblem(http.StatusUnauthorized, CodeUnauthorized,
				"missing bearer token (Authorization: Bearer <token>)"), 0)
			return
		}
		got := sha256.Sum256([]byte(strings.TrimSpace(h[len(scheme):])))
		if subtle.ConstantTimeCompare(got[:], a.token[:]) != 1 {
			writeProblem(w, r, newProblem(http.StatusUnauthorized, CodeUnauthorized, "invalid bearer token"), 0)
			return
		}
		next(w, r)
	})
}

func (a *API) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "replica": a.cfg.Replica})
}

// readyz runs every check concurrently; 503 names each failing dependency.
func (a *API) readyz(w http.ResponseWriter, r *http.Request) {
	results := make(map[string]string, len(a.cfg.Checks))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range a.cfg.Checks {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(r.Context(), a.cfg.CheckTimeout)
			defer cancel()
			res := "ok"
			if err := runCheck(ctx, c); err != nil {
				res = err.Error()
			}
			mu.Lock()
			results[c.Name] = res
			mu.Unlock()
		})
	}
	wg.Wait()
	var failing []string
	for _, c := range a.cfg.Checks {
		if results[c.Name] != "ok" {
			failing = append(failing, c.Name+": "+results[c.Name])
		}
	}
	if a.Draining() {
		failing = append(failing, "replica: shutting down")
		results["replica"] = "shutting down"
	}
	if len(failing) > 0 {
		p := newProblem(http.StatusServiceUnavailable, CodeNotReady, "not ready: "+strings.Join(failing, "; "))
		p.Checks = results
		writeProblem(w, r, p, 0)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "replica": a.cfg.Replica, "checks": results})
}

// runCheck calls c.Check, turning a panic or an overrun into an error.
func runCheck(ctx context.Context, c Check) (err error) {
	done := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- fmt.Errorf("check panicked: %v", p)
			}
		}()
		done <- c.Check(ctx)
	}()
	select {
	case err = <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no answer within %s", context.Cause(ctx))
	}
}

// readBody reads the body under the size limit. It writes the problem and
// returns false when the body is too large, of the wrong type or unreadable.
func (a *API) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			writeProblem(w, r, newProblem(http.StatusUnsupportedMediaType, CodeUnsupportedMediaType,
				"send the body as application/json"), 0)
			return nil, false
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeProblem(w, r, newProblem(http.StatusRequestEntityTooLarge, CodePayloadTooLarge,
				fmt.Sprintf("request body exceeds %d bytes", a.cfg.MaxBodyBytes)), 0)
			return nil, false
		}
		writeProblem(w, r, newProblem(http.StatusBadRequest, CodeBadInput, "could not read the request body"), 0)
		return nil, false
	}
	return body, true
}

func (a *API) refuseWhileDraining(w http.ResponseWriter, r *http.Request) bool {
	if !a.Draining() {
		return false
	}
	writeProblem(w, r, newProblem(http.StatusServiceUnavailable, CodeShuttingDown,
		"this replica is shutting down and takes no new work; retry on another replica"), 5)
	return true
}

// trigger builds the job trigger of an HTTP request: the body's request_id
// wins over X-Request-Id (already in the context).
func trigger(r *http.Request, requestID, requestedBy string) job.Trigger {
	if requestID == "" {
		requestID = requestIDFrom(r.Context())
	}
	if requestedBy == "" {
		requestedBy = "http"
	}
	return job.Trigger{Source: job.SourceHTTP, RequestID: requestID, RequestedBy: requestedBy}
}

// Accepted is the body of a 202 answer.
type Accepted struct {
	job.Result
	Status    string `json:"status"`
	StatusURL string `json:"status_url,omitempty"`
}

// postRun starts a run of k: decode the body (strict), then run it to its
// end, or for an HTTPAsync kind, until it is owned.
func (a *API) postRun(k owned.Kind) http.HandlerFunc {
	spec := k.Spec()
	return func(w http.ResponseWriter, r *http.Request) {
		if a.refuseWhileDraining(w, r) {
			return
		}
		body, ok := a.readBody(w, r)
		if !ok {
			return
		}
		req, err := DecodeRunRequest(k, body)
		if err != nil {
			writeProblem(w, r, newProblem(http.StatusBadRequest, CodeBadInput, badInputDetail(err)), 0)
			return
		}
		t := trigger(r, req.RequestID, req.RequestedBy)
		var (
			res     job.Result
			started bool
		)
		if spec.HTTPAsync {
			res, started, err = a.cfg.Dispatcher.Start(r.Context(), k, req.Params, t)
		} else {
			ctx, cancel := context.WithTimeout(r.Context(), a.cfg.SyncTimeout)
			res, err = a.cfg.Dispatcher.Run(ctx, k, req.Params, t)
			cancel()
		}
		switch {
		case err != nil && (a.Draining() || res.Outcome == job.OutcomeUnavailable):
			// The dispatcher refused the work (it is shutting down).
			writeProblem(w, r, newProblem(http.StatusServiceUnavailable, CodeShuttingDown,
				"this replica takes no new work; retry on another replica"), 5)
			return
		case err != nil:
			a.log.Warn("http_run_error", "job", spec.Name, "request_id", t.RequestID, "error", err)
			writeProblem(w, r, newProblem(http.StatusInternalServerError, CodeInternal, "the run could not be started"), 0)
			return
		}
		if !started {
			a.writeResult(w, r, res)
			return
		}
		acc := Accepted{Result: res, Status: "started"}
		if sk, ok := k.(owned.StatusKind); ok {
			acc.StatusURL = spec.HTTPPath + "/" + url.PathEscape(sk.StatusID(req.Params))
			w.Header().Set("Location", acc.StatusURL)
		}
		writeJSON(w, http.StatusAccepted, acc)
	}
}

// writeResult answers with a final job result: 200 for completed and
// already_completed, a problem document otherwise.
func (a *API) writeResult(w http.ResponseWriter, r *http.Request, res job.Result) {
	var p Problem
	retry := 0
	switch res.Outcome {
	case job.OutcomeCompleted, job.OutcomeAlreadyCompleted:
		writeJSON(w, http.StatusOK, res)
		return
	case job.OutcomeAlreadyOwned:
		detail := fmt.Sprintf("%s is owned by another replica", res.Key)
		if res.Owner != "" {
			detail = fmt.Sprintf("%s is owned by %s", res.Key, res.Owner)
		}
		p = newProblem(http.StatusConflict, CodeLockAcquisitionFailed, detail)
		p.Reason = string(ownership.ReasonAlreadyOwned)
		p.Owner = res.Owner
	case job.OutcomeUnavailable:
		p = newProblem(http.StatusServiceUnavailable, CodeLockAcquisitionFailed,
			withCause("the lock backend is unavailable; nothing was run", res.Error))
		p.Reason = string(ownership.ReasonUnavailable)
		retry = 5
	case job.OutcomeLost:
		p = newProblem(http.StatusServiceUnavailable, CodeOwnershipLost,
			withCause("ownership was lost before the work finished; a later trigger resumes it", res.Error))
		p.Reason = "lost"
		p.Owner = res.Owner
		retry = 5
	default:
		p = newProblem(http.StatusInternalServerError, CodeRunFailed, withCause("the run failed", res.Error))
		p.Reason = string(res.Outcome)
	}
	p.LockKey = res.Key
	writeProblem(w, r, p, retry)
}

func withCause(msg, cause string) string {
	if cause == "" {
		return msg
	}
	return msg + ": " + cause
}

// getStatus answers GET {path}/{id} for k.
func (a *API) getStatus(k owned.Kind) http.HandlerFunc {
	name := k.Spec().Name
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if err := checkText("id", id, maxPathIDLen); err != nil {
			writeProblem(w, r, newProblem(http.StatusBadRequest, CodeBadInput, err.Error()), 0)
			return
		}
		st, err := a.cfg.Dispatcher.Status(r.Context(), k, id)
		switch {
		case err == nil:
			writeJSON(w, http.StatusOK, st)
		case errors.Is(err, job.ErrBadInput):
			writeProblem(w, r, newProblem(http.StatusBadRequest, CodeBadInput, err.Error()), 0)
		case errors.Is(err, owned.ErrNotFound):
			writeProblem(w, r, newProblem(http.StatusNotFound, CodeNotFound, fmt.Sprintf("no %s run %s", name, id)), 0)
		default:
			a.log.Warn("http_status_error", "job", name, "id", id, "error", err)
			writeProblem(w, r, newProblem(http.StatusServiceUnavailable, CodeBackendUnavailable,
				name+" state could not be read: "+err.Error()), 5)
		}
	}
}

func (a *API) getLocks(w http.ResponseWriter, r *http.Request) {
	locks := []ownership.LockInfo{}
	if a.cfg.Locks != nil {
		got, err := a.cfg.Locks.Locks(r.Context())
		if err != nil {
			a.log.Warn("http_locks_error", "error", err)
			writeProblem(w, r, newProblem(http.StatusServiceUnavailable, CodeBackendUnavailable,
				"locks could not be listed: "+err.Error()), 5)
			return
		}
		if got != nil {
			locks = got
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"locks": locks})
}

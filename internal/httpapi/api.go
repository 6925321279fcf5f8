// Package httpapi is the coordinator's admin HTTP API: liveness, readiness,
// dependency health, Prometheus metrics, list held locks, and for every
// registered kind of owned run with an HTTP path (owned.Spec.HTTPPath):
// POST to start a run, and GET {path}/{id} for a kind with run ids
// (owned.Def.StatusID).
//
// Three questions, three endpoints, none of which does I/O per request:
//
//	GET /healthz    is the process alive?         200 always (liveness)
//	GET /readyz     may it be sent work?           503 while starting, with
//	                                               migrations pending, or
//	                                               shutting down (readiness)
//	GET /v1/health  how are its dependencies?      authenticated, the latest
//	                                               background checks with detail
//
// Readiness leaves out the shared dependencies on purpose: when Redis is
// down it is down for every replica, and failing readiness would empty the
// Service and take the admin API away exactly when operators need it.
// /readyz names failing conditions only, never hosts, users or errors.
//
// Errors are RFC 9457 problem documents (application/problem+json) with the
// ADR-024 (docs/adr/024-distributed-lock-strategy.md) members code, reason, lockKey and owner where they apply. /v1/*
// needs `Authorization: Bearer <token>` with one of the admin tokens
// (internal/adminauth): GET needs the read scope, POST the mutate scope.
// With no token configured /v1/* answers 403. Every refusal is logged at
// warn (never the token) and counted.
//
// Status codes of a POST: 200 completed or already completed, 409 already
// owned (owner named), 429 the replica's cap on runs in flight is reached
// (Retry-After), 503 lock backend unavailable, ownership lost mid-run,
// shutting down, or a failure of a transient cause (a dependency down) whose
// request could not be recorded (Retry-After, "retryable": true: nothing
// owes the run, send it again), 400 bad input, 401/403 auth, 500 the run
// failed for good. A kind with HTTPAsync (bill runs) answers 202 as soon as
// the run is owned and claimed (the claim is its durable record); Location
// names the status URL. The others wait for the outcome, bounded by
// SyncTimeout. A run that failed for a transient cause but whose request was
// recorded for the resumer is 202 too, with status "deferred".
package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/telco-platform/coordinator/internal/adminauth"
	"github.com/telco-platform/coordinator/internal/health"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// Dispatcher is the part of trigger.Dispatcher the API drives. Its errors
// mean the work was refused: job.ErrAtCapacity (the cap on runs in flight),
// or the replica is shutting down.
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

// Health reports the dependencies (health.Monitor): the latest background
// check of each.
type Health interface {
	Snapshot() []health.Result
}

// Config wires the API. Dispatcher is required.
type Config struct {
	// Replica is this replica's id (shown in /healthz and /readyz).
	Replica string
	// Tokens guard /v1/*, each with its scopes. None: /v1/* answers 403.
	Tokens []adminauth.Token
	// Kinds are the kinds of owned run with routes. Required.
	Kinds *owned.Registry
	// Dispatcher runs them. Required.
	Dispatcher Dispatcher
	// Locks answers GET /v1/locks. Nil: an empty list.
	Locks ownership.Inspector
	// Health answers GET /v1/health. Nil: no dependencies are reported.
	Health Health
	// Metrics serves GET /metrics (promhttp.HandlerFor). Nil: 404.
	Metrics http.Handler
	// Console serves /ui/ (internal/console), behind its own login. Nil:
	// no console.
	Console http.Handler
	// MaxBodyBytes bounds a request body. Default 64 KiB.
	MaxBodyBytes int64
	// SyncTimeout bounds a synchronous run request (a kind without
	// HTTPAsync). Default 2m.
	SyncTimeout time.Duration
	// Log receives one line per request (debug) and per failure (warn).
	Log *slog.Logger
	// Registerer gets coordinator_http_requests_total,
	// coordinator_http_request_duration_seconds and
	// coordinator_http_auth_failures_total. Nil: not registered.
	Registerer prometheus.Registerer
}

// RetryAfterAtCapacity is the Retry-After of a 429 (seconds): runs take
// minutes, so sooner would only be refused again.
const RetryAfterAtCapacity = 10

// RetryAfterUnavailable is the Retry-After of a 503 (seconds): a
// dependency down (the lock backend, Postgres), ownership lost, the replica
// shutting down.
const RetryAfterUnavailable = 5

// API is the admin HTTP handler.
type API struct {
	cfg      Config
	tokens   *adminauth.Set
	log      *slog.Logger
	mux      *http.ServeMux
	draining atomic.Bool

	// notReady are the readiness conditions failing now: name -> a fixed
	// reason of ours (never an error text).
	readyMu  sync.Mutex
	notReady map[string]string

	requests     *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	authFailures *prometheus.CounterVec
}

// New builds the API; it validates cfg.
func New(cfg Config) (*API, error) {
	if cfg.Dispatcher == nil || cfg.Kinds == nil {
		return nil, errors.New("httpapi: Config.Dispatcher and Config.Kinds are required")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.SyncTimeout <= 0 {
		cfg.SyncTimeout = 2 * time.Minute
	}
	tokens, err := adminauth.NewSet(cfg.Tokens)
	if err != nil {
		return nil, fmt.Errorf("httpapi: %w", err)
	}
	a := &API{cfg: cfg, tokens: tokens, log: cfg.Log, mux: http.NewServeMux(), notReady: map[string]string{}}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	// Every label is from a fixed set: route is the mux pattern (never the
	// path), method one of knownMethods or "other", code a status we wrote.
	a.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "coordinator_http_requests_total",
		Help: "Admin API requests by route pattern, method (other for unknown ones) and status code.",
	}, []string{"route", "method", "code"})
	a.authFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "coordinator_http_auth_failures_total",
		Help: "Admin API requests refused by authentication or authorization, by reason.",
	}, []string{"reason"})
	a.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "coordinator_http_request_duration_seconds",
		Help:    "Admin API request duration by route.",
		Buckets: prometheus.DefBuckets,
	}, []string{"route"})
	// At 0 from the start, so an alert's increase() counts the first refusals.
	for _, reason := range []string{authDisabled, authMissingToken, authInvalidToken, authMissingScope} {
		a.authFailures.WithLabelValues(reason)
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{a.requests, a.duration, a.authFailures} {
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
func (a *API) Drain() {
	a.draining.Store(true)
	a.SetNotReady(ConditionShuttingDown, "this replica is shutting down")
}

// Readiness conditions the replica sets (the names /readyz shows).
const (
	ConditionStarting     = "starting"
	ConditionMigrations   = "migrations"
	ConditionShuttingDown = "shutting_down"
)

// SetNotReady makes /readyz fail naming condition, with reason: a fixed
// text of the caller's, shown unauthenticated, so never an error's text.
func (a *API) SetNotReady(condition, reason string) {
	a.readyMu.Lock()
	defer a.readyMu.Unlock()
	a.notReady[condition] = reason
}

// SetReady clears condition.
func (a *API) SetReady(condition string) {
	a.readyMu.Lock()
	defer a.readyMu.Unlock()
	delete(a.notReady, condition)
}

// NotReady returns the failing readiness conditions.
func (a *API) NotReady() map[string]string {
	a.readyMu.Lock()
	defer a.readyMu.Unlock()
	return maps.Clone(a.notReady)
}

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
	if a.cfg.Console != nil {
		// /ui too: the console's answer to it (a redirect to /ui/) carries
		// its security headers like every other.
		m.Handle("/ui/", a.cfg.Console)
		m.Handle("/ui", a.cfg.Console)
	}
	m.Handle("GET /v1/locks", a.auth(adminauth.Read, a.getLocks))
	m.Handle("GET /v1/health", a.auth(adminauth.Read, a.getHealth))
	// Other methods on known paths: 405 as a problem document.
	allowed := map[string]string{"/healthz": "GET, HEAD", "/readyz": "GET, HEAD", "/v1/locks": "GET, HEAD", "/v1/health": "GET, HEAD"}
	for _, k := range a.cfg.Kinds.Kinds() {
		path := k.Spec().HTTPPath
		if path == "" {
			continue
		}
		m.Handle("POST "+path, a.auth(adminauth.Mutate, a.postRun(k)))
		allowed[path] = "POST"
		if k.HasStatus() {
			m.Handle("GET "+path+"/{id}", a.auth(adminauth.Read, a.getStatus(k)))
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
				fmt.Sprintf("%s is not allowed on %s (allowed: %s)", methodLabel(r.Method), r.URL.Path, allow)), 0)
		})
	}
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, newProblem(http.StatusNotFound, CodeNotFound, "no such resource"), 0)
	})
}

// healthz is liveness: the process answers. It checks nothing else.
func (a *API) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "replica": a.cfg.Replica})
}

// readyz is readiness: 503 naming each failing condition (starting,
// migrations, shutting_down) and nothing else. No I/O.
func (a *API) readyz(w http.ResponseWriter, r *http.Request) {
	failing := a.NotReady()
	if len(failing) == 0 {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready", "replica": a.cfg.Replica})
		return
	}
	names := slices.Sorted(maps.Keys(failing))
	p := newProblem(http.StatusServiceUnavailable, CodeNotReady, "not ready: "+strings.Join(names, ", "))
	p.Checks = failing
	writeProblem(w, r, p, 5)
}

// HealthReport is the body of GET /v1/health.
type HealthReport struct {
	// Status is "ok" when every dependency passed its latest check and the
	// replica is ready, else "degraded".
	Status  string `json:"status"`
	Replica string `json:"replica"`
	Ready   bool   `json:"ready"`
	// NotReady are the failing readiness conditions (as in /readyz).
	NotReady map[string]string `json:"not_ready,omitempty"`
	// Dependencies are the latest background checks, with error detail.
	Dependencies []health.Result `json:"dependencies"`
}

// getHealth reports readiness and the dependencies' latest checks, with
// detail; authenticated, because the detail names hosts and ports. It
// answers 200 whatever the state: the body says; alert on
// coordinator_dependency_up.
func (a *API) getHealth(w http.ResponseWriter, _ *http.Request) {
	rep := HealthReport{Status: "ok", Replica: a.cfg.Replica, NotReady: a.NotReady(), Dependencies: []health.Result{}}
	rep.Ready = len(rep.NotReady) == 0
	if a.cfg.Health != nil {
		rep.Dependencies = a.cfg.Health.Snapshot()
	}
	if !rep.Ready {
		rep.Status = "degraded"
	}
	for _, d := range rep.Dependencies {
		if !d.OK {
			rep.Status = "degraded"
		}
	}
	writeJSON(w, http.StatusOK, rep)
}

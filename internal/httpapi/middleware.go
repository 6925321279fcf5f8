package httpapi

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/telco-platform/coordinator/internal/adminauth"
	"github.com/telco-platform/coordinator/internal/events"
)

// The middleware every request goes through: its request id and principal,
// its metrics, and the token check of /v1/*.

type ctxKey int

const (
	requestIDKey ctxKey = iota
	principalKey
)

func requestIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey).(string)
	return id
}

// principalFrom is the caller auth let through ("" outside /v1/*).
func principalFrom(ctx context.Context) string {
	p, _ := ctx.Value(principalKey).(string)
	return p
}

// knownMethods are the method label's values besides "other": a client
// can send any token as a method, and each would be a new series.
var knownMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace}

// methodLabel maps a request method to a fixed set.
func methodLabel(m string) string {
	if slices.Contains(knownMethods, m) {
		return m
	}
	return "other"
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
		nameSpan(r, route)
		method := methodLabel(r.Method)
		a.requests.WithLabelValues(route, method, fmt.Sprint(rec.status)).Inc()
		a.duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
		level := slog.LevelDebug
		if rec.status >= 500 {
			level = slog.LevelWarn
		}
		a.log.Log(r.Context(), level, "http_request", "method", method, "route", route,
			"status", rec.status, "duration_ms", time.Since(start).Milliseconds(), "request_id", id)
	})
}

// Reasons of coordinator_http_auth_failures_total and of the
// http_auth_failed log line.
const (
	authDisabled     = "disabled"      // no admin token is configured
	authMissingToken = "missing_token" // no Authorization: Bearer header
	authInvalidToken = "invalid_token" // a token no admin token matches
	authMissingScope = "missing_scope" // a valid token without the route's scope
)

// auth guards a /v1/* route that needs scope: 403 with no token configured
// or for a token without the scope, 401 for a missing or unknown bearer
// token. The lookup is constant-time (adminauth.Set). The caller's token
// name goes into the request's context: runs record it as their principal.
func (a *API) auth(scope adminauth.Scope, next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.tokens.Empty() {
			a.authFailed(r, authDisabled, "")
			writeProblem(w, r, newProblem(http.StatusForbidden, CodeForbidden,
				"the admin API is disabled: neither COORDINATOR_ADMIN_TOKEN nor COORDINATOR_ADMIN_TOKENS_FILE is set"), 0)
			return
		}
		const scheme = "bearer "
		h := r.Header.Get("Authorization")
		if len(h) < len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) {
			a.authFailed(r, authMissingToken, "")
			writeProblem(w, r, newProblem(http.StatusUnauthorized, CodeUnauthorized,
				"missing bearer token (Authorization: Bearer <token>)"), 0)
			return
		}
		p, ok := a.tokens.Authenticate(strings.TrimSpace(h[len(scheme):]))
		if !ok {
			a.authFailed(r, authInvalidToken, "")
			writeProblem(w, r, newProblem(http.StatusUnauthorized, CodeUnauthorized, "invalid bearer token"), 0)
			return
		}
		if !p.Scopes.Has(scope) {
			a.authFailed(r, authMissingScope, p.Name)
			writeProblem(w, r, newProblem(http.StatusForbidden, CodeForbidden,
				fmt.Sprintf("the token %q has the scopes %s; %s %s needs %s", p.Name, p.Scopes, r.Method, r.Pattern, scope)), 0)
			return
		}
		next(w, r.WithContext(context.WithValue(r.Context(), principalKey, p.Name)))
	})
}

// authFailed logs and counts a refused request: never the token, nor any
// header; the principal only when the token was valid.
func (a *API) authFailed(r *http.Request, reason, principal string) {
	a.authFailures.WithLabelValues(reason).Inc()
	args := []any{"reason", reason, "method", methodLabel(r.Method), "route", r.Pattern,
		"remote_addr", r.RemoteAddr, "request_id", requestIDFrom(r.Context())}
	if principal != "" {
		args = append(args, "principal", principal)
	}
	a.log.Warn("http_auth_failed", args...)
}

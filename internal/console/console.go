// Package console is the operator console served by `coordinator serve`
// under /ui/ on the admin listener: who owns what, how far each run is,
// what went wrong, live, in a browser (docs/console.md).
//
// Access: /ui/login takes an admin token with the read scope (a form field,
// never a URL) and sets an HttpOnly, SameSite=Strict cookie (Secure under
// TLS) naming a server-side session with an expiry (Sessions; only the
// SHA-256 of its id is stored); /ui/logout ends it. Without a session every
// path but the login answers 303 to /ui/login, the event stream 401, and
// neither shows data. The one action (a bill run of a closed period) needs
// the mutate scope and the session's CSRF token, and goes through the admin
// API's own code (TriggerFunc), so its answer is the API's.
//
// Pages render on the server with html/template and work without
// JavaScript; one small script (static/console.js, no build step) adds the
// live parts: the event stream (Server-Sent Events) on the events page and
// the progress bars of the overview. Everything is embedded; the
// Content-Security-Policy allows scripts, styles and connections from the
// console itself only, and no inline script or style.
//
// The console reads through narrow interfaces (data.go) and imports no
// kind, store or transport of the coordinator.
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/telco-platform/coordinator/internal/adminauth"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Paths of the console (docs/contract.md).
const (
	Prefix      = "/ui/"
	PathLogin   = "/ui/login"
	PathLogout  = "/ui/logout"
	PathLocks   = "/ui/locks"
	PathRuns    = "/ui/runs/"
	PathEvents  = "/ui/events"
	PathStream  = "/ui/stream"
	PathTrigger = "/ui/trigger"
	// PathStatic serves the script and stylesheet (behind the session);
	// the login page's stylesheet is under the login's own path.
	PathStatic   = "/ui/static/"
	PathLoginCSS = "/ui/login/console.css"
)

// CookieName is the session cookie; loginCookie carries the login form's
// CSRF token until the login.
const (
	CookieName  = "coordinator_console"
	loginCookie = "coordinator_console_login"
)

// ContentSecurityPolicy is sent with every answer: nothing from elsewhere,
// no inline script or style, no framing, forms post only here.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Deps are what the console reads through. Store and Sessions are
// required; the rest may be nil (the page says what is not available).
type Deps struct {
	Store    Store
	Sessions Sessions
	Locks    Locks
	Health   Health
	Events   Events
	Trigger  TriggerFunc
	InFlight InFlightFunc
}

// Console is the /ui/ handler.
type Console struct {
	cfg    Config
	deps   Deps
	tokens *adminauth.Set
	mux    *http.ServeMux
	pages  *renderer
	static fs.FS

	streams atomic.Int64
	// perSession counts each session's open streams (by its id's hash).
	perSessionMu sync.Mutex
	perSession   map[string]int
	metrics      *metrics

	closing   chan struct{}
	closeOnce sync.Once

	progMu   sync.Mutex
	progAt   time.Time
	progLast []InFlight
}

// New validates cfg and returns the handler.
func New(cfg Config, deps Deps) (*Console, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Store == nil || deps.Sessions == nil {
		return nil, errors.New("console: Deps.Store and Deps.Sessions are required")
	}
	cfg = cfg.withDefaults()
	tokens, err := adminauth.NewSet(cfg.Tokens)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	pages, err := newRenderer()
	if err != nil {
		return nil, err
	}
	static, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, deps: deps, tokens: tokens, mux: http.NewServeMux(), pages: pages, static: static, metrics: m,
		closing: make(chan struct{}), perSession: map[string]int{}}
	c.routes()
	return c, nil
}

func (c *Console) routes() {
	m := c.mux
	m.Handle("GET /ui", http.RedirectHandler(Prefix, http.StatusMovedPermanently))
	m.HandleFunc("GET /ui/login", c.loginForm)
	m.HandleFunc("POST /ui/login", c.login)
	m.HandleFunc("GET "+PathLoginCSS, c.serveStatic("console.css"))
	m.Handle("GET /ui/logout", c.session(false, c.logoutForm))
	m.Handle("POST /ui/logout", c.session(false, c.logout))
	m.Handle("GET /ui/{$}", c.session(false, c.overview))
	m.Handle("GET /ui/locks", c.session(false, c.locks))
	m.Handle("GET /ui/runs/{kind}", c.session(false, c.runs))
	m.Handle("GET /ui/runs/{kind}/{key...}", c.session(false, c.run))
	m.Handle("GET /ui/events", c.session(false, c.eventsPage))
	m.Handle("GET /ui/stream", c.session(true, c.stream))
	m.Handle("POST /ui/trigger", c.session(false, c.trigger))
	m.Handle("GET /ui/static/{file}", c.session(false, func(w http.ResponseWriter, r *http.Request, _ Session) {
		c.serveStatic(r.PathValue("file"))(w, r)
	}))
	// Anything else under /ui/: with a session a 404 page, without one the
	// login (no path's existence is told to a stranger).
	m.Handle("/ui/", c.session(false, func(w http.ResponseWriter, r *http.Request, s Session) {
		c.notFound(w, r, s, "no such page")
	}))
}

// ServeHTTP sets the security headers of every answer, then routes.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	// same-origin, not no-referrer: under no-referrer a browser sends
	// "Origin: null" with the console's own form posts.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	// A token must never travel in a URL: a query naming one is refused
	// unread (and the request log never has queries).
	if r.URL.Query().Has("token") {
		c.metrics.refused("token_in_url")
		http.Error(w, "a token is never accepted in a URL: use the login form", http.StatusBadRequest)
		return
	}
	c.mux.ServeHTTP(w, r)
}

// Shutdown ends every event stream (the replica is stopping: a stream
// never goes idle on its own, so the HTTP server's graceful stop would wait
// for it). Safe twice.
func (c *Console) Shutdown() { c.closeOnce.Do(func() { close(c.closing) }) }

// Streams is how many event streams are open now.
func (c *Console) Streams() int64 { return c.streams.Load() }

func (c *Console) serveStatic(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, err := fs.ReadFile(c.static, name)
		if err != nil || strings.Contains(name, "/") {
			http.NotFound(w, r)
			return
		}
		switch {
		case strings.HasSuffix(name, ".css"):
			w.Header().Set("Content-Type", "text/css; charset=utf-8")
		case strings.HasSuffix(name, ".js"):
			w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Cache-Control", "private, max-age=300")
		_, _ = w.Write(b)
	}
}

// handler is a page's handler with its session.
type handler func(w http.ResponseWriter, r *http.Request, s Session)

// session guards a route: without a valid session 303 to the login (401
// for the stream, which a browser's EventSource cannot follow to a form).
// A POST must also come from the console's own pages (Origin) and carry
// the session's CSRF token.
func (c *Console) session(stream bool, next handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, ok := c.current(r)
		if !ok {
			if stream {
				http.Error(w, "no console session: log in at "+PathLogin, http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, PathLogin, http.StatusSeeOther)
			return
		}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
			if !sameOrigin(r) {
				c.metrics.refused("cross_origin")
				c.cfg.Log.Warn("console_refused", "reason", "cross_origin", "principal", s.Principal, "route", r.Pattern, "remote_addr", r.RemoteAddr)
				http.Error(w, "cross-origin form posts are refused", http.StatusForbidden)
				return
			}
			if !equalSecret(r.PostFormValue("csrf"), s.CSRF) {
				c.metrics.refused("csrf")
				c.cfg.Log.Warn("console_refused", "reason", "csrf", "principal", s.Principal, "route", r.Pattern, "remote_addr", r.RemoteAddr)
				http.Error(w, "the form's CSRF token does not match this session: reload the page", http.StatusForbidden)
				return
			}
		}
		next(w, r, s)
	})
}

// current is the request's session, if valid: the cookie names a stored,
// unexpired session whose token still exists here with the secret it was
// opened with; its scopes are those it had at login that the token still
// has.
func (c *Console) current(r *http.Request) (Session, bool) {
	ck, err := r.Cookie(CookieName)
	if err != nil || ck.Value == "" || len(ck.Value) > 128 {
		return Session{}, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	s, ok, err := c.deps.Sessions.LookupSession(ctx, hashID(ck.Value))
	if err != nil {
		c.cfg.Log.Warn("console_session_lookup_failed", "error", err)
		return Session{}, false
	}
	if !ok {
		return Session{}, false
	}
	scopes, ok := c.tokens.Scopes(s.Principal)
	fp, _ := c.tokens.Fingerprint(s.Principal)
	if !ok || !equalSecret(s.CSRF, sessionCSRF(fp, ck.Value)) {
		// The token is gone, or was rotated since the login (its name
		// stays, its secret changed): the session ends with it.
		return Session{}, false
	}
	s.Read = s.Read && scopes.Has(adminauth.Read)
	s.Mutate = s.Mutate && scopes.Has(adminauth.Mutate)
	if !s.Read {
		return Session{}, false
	}
	return s, true
}

// sameOrigin accepts a POST that the browser says came from the console's
// own pages: Sec-Fetch-Site same-origin where the browser sends it, else an
// Origin naming this host. A client with neither (curl) still needs the
// CSRF token.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
		return site == "same-origin"
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		return err == nil && u.Host == r.Host
	}
	return true
}

func equalSecret(a, b string) bool {
	return len(a) > 0 && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// sessionCSRF is a session's CSRF token: an HMAC of the session id keyed
// by the fingerprint (SHA-256) of the token's secret. Nobody derives it
// without the id, which only the HttpOnly cookie holds, and it binds the
// session to the secret that opened it: current recomputes it with the
// token's secret of now, so a rotated token (same name, new secret) ends
// the sessions of the old one, on every replica that runs with the new.
func sessionCSRF(tokenFingerprint [32]byte, id string) string {
	m := hmac.New(sha256.New, tokenFingerprint[:])
	m.Write([]byte("coordinator-console-session\x00" + id))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func hashID(id string) []byte {
	h := sha256.Sum256([]byte(id))
	return h[:]
}

func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// secure says whether cookies need Secure: the request came over TLS, or
// through a proxy that terminated it.
func secure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

func (c *Console) loginForm(w http.ResponseWriter, r *http.Request) {
	if _, ok := c.current(r); ok {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	c.renderLogin(w, r, http.StatusOK, "")
}

// renderLogin shows the form with a fresh login CSRF token (double
// submit: the cookie and the form carry the same value).
func (c *Console) renderLogin(w http.ResponseWriter, r *http.Request, status int, msg string) {
	tok := randomToken()
	http.SetCookie(w, &http.Cookie{Name: loginCookie, Value: tok, Path: PathLogin, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: secure(r), MaxAge: 3600})
	c.pages.render(w, status, "login", page{Title: "Log in", Replica: c.cfg.Replica, Data: loginView{CSRF: tok, Error: msg}})
}

const loginFailed = "That token is not valid here, or it lacks the read scope."

// login checks the token (constant time, adminauth) and starts a session.
// The token is never logged or echoed; a failure says nothing about why.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	if err := r.ParseForm(); err != nil {
		c.renderLogin(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	ck, err := r.Cookie(loginCookie)
	if !sameOrigin(r) || err != nil || !equalSecret(r.PostForm.Get("csrf"), ck.Value) {
		c.metrics.login("csrf")
		c.cfg.Log.Warn("console_login_failed", "reason", "csrf", "remote_addr", r.RemoteAddr,
			"same_origin", sameOrigin(r), "form_cookie", err == nil, "form_field", r.PostForm.Get("csrf") != "")
		c.renderLogin(w, r, http.StatusForbidden, "The login form expired: try again.")
		return
	}
	p, ok := c.tokens.Authenticate(strings.TrimSpace(r.PostForm.Get("token")))
	if !ok || !p.Scopes.Has(adminauth.Read) {
		reason := "invalid_token"
		if ok {
			reason = "missing_scope"
		}
		c.metrics.login(reason)
		args := []any{"reason", reason, "remote_addr", r.RemoteAddr}
		if ok {
			args = append(args, "principal", p.Name)
		}
		c.cfg.Log.Warn("console_login_failed", args...)
		c.renderLogin(w, r, http.StatusUnauthorized, loginFailed)
		return
	}
	id := randomToken()
	fp, _ := c.tokens.Fingerprint(p.Name)
	s := Session{IDHash: hashID(id), Principal: p.Name, Read: true, Mutate: p.Scopes.Has(adminauth.Mutate),
		CSRF: sessionCSRF(fp, id), Expires: c.cfg.Now().Add(c.cfg.SessionTTL)}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := c.deps.Sessions.CreateSession(ctx, s); err != nil {
		c.cfg.Log.Warn("console_login_failed", "reason", "store", "principal", p.Name, "error", err)
		c.renderLogin(w, r, http.StatusServiceUnavailable, "The session could not be stored (is PostgreSQL reachable?). Try again.")
		return
	}
	c.metrics.login("ok")
	c.cfg.Log.Info("console_login", "principal", p.Name, "scopes", p.Scopes.String(), "remote_addr", r.RemoteAddr,
		"expires", s.Expires.UTC().Format(time.RFC3339))
	http.SetCookie(w, &http.Cookie{Name: loginCookie, Value: "", Path: PathLogin, MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: secure(r)})
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: id, Path: Prefix, Expires: s.Expires,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure(r)})
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

func (c *Console) logoutForm(w http.ResponseWriter, _ *http.Request, s Session) {
	c.pages.render(w, http.StatusOK, "logout", c.page("Log out", s, nil))
}

// logout deletes the session (every replica sees it gone) and the cookie.
func (c *Console) logout(w http.ResponseWriter, r *http.Request, s Session) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := c.deps.Sessions.DeleteSession(ctx, s.IDHash); err != nil {
		c.cfg.Log.Warn("console_logout_failed", "principal", s.Principal, "error", err)
		http.Error(w, "the session could not be ended (is PostgreSQL reachable?): try again", http.StatusServiceUnavailable)
		return
	}
	c.cfg.Log.Info("console_logout", "principal", s.Principal, "remote_addr", r.RemoteAddr)
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: secure(r)})
	http.Redirect(w, r, PathLogin, http.StatusSeeOther)
}

// metrics are the console's series.
type metrics struct {
	logins  *prometheus.CounterVec
	refusal *prometheus.CounterVec
	dropped prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		logins: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "coordinator_console_logins_total",
			Help: "Console logins by result: ok, invalid_token, missing_scope, csrf."}, []string{"result"}),
		refusal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "coordinator_console_refusals_total",
			Help: "Console requests refused with a session: csrf, cross_origin, missing_scope, token_in_url, token_in_field, too_many_streams."},
			[]string{"reason"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "coordinator_console_stream_events_dropped_total",
			Help: "Live-tail events dropped for event streams whose reader fell behind its buffer."}),
	}
	for _, r := range []string{"ok", "invalid_token", "missing_scope", "csrf"} {
		m.logins.WithLabelValues(r)
	}
	for _, r := range []string{"csrf", "cross_origin", "missing_scope", "token_in_url", "token_in_field", "too_many_streams"} {
		m.refusal.WithLabelValues(r)
	}
	if reg != nil {
		for _, col := range []prometheus.Collector{m.logins, m.refusal, m.dropped} {
			if err := reg.Register(col); err != nil {
				return nil, fmt.Errorf("console: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *metrics) login(result string)   { m.logins.WithLabelValues(result).Inc() }
func (m *metrics) refused(reason string) { m.refusal.WithLabelValues(reason).Inc() }

// kindKnown says whether name is a kind of this deployment.
func (c *Console) kindKnown(name string) bool { return slices.Contains(c.cfg.Kinds, name) }

package console_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/adminauth"
	"github.com/telco-platform/coordinator/internal/console"
	"github.com/telco-platform/coordinator/internal/consoledb"
	"github.com/telco-platform/coordinator/internal/eventtail"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// site is a console on a real Postgres schema (its sessions and tables),
// an in-memory Locker, a tail fed by Publish, and a trigger that records
// what it was asked.
type site struct {
	pool    *pgxpool.Pool
	srv     *httptest.Server
	con     *console.Console
	store   *consoledb.Store
	tail    *eventtail.Tail
	locker  *ownership.MemoryLocker
	logs    *lockedBuffer
	read    string // a token with the read scope
	all     string // read and mutate
	mutate  string // mutate only
	trigger *triggerRecorder
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type triggerRecorder struct {
	mu    sync.Mutex
	calls []string
}

func (t *triggerRecorder) fn(_ context.Context, principal, path string, body []byte) (int, string, []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.calls = append(t.calls, principal+" "+path+" "+string(body))
	if len(t.calls) > 1 {
		return http.StatusConflict, "application/problem+json",
			[]byte(`{"status":409,"code":"LOCK_ACQUISITION_FAILED","reason":"already_owned","owner":"replica-x","lockKey":"billrun:2026-01","detail":"billrun:2026-01 is owned by replica-x"}`)
	}
	return http.StatusAccepted, "application/json", []byte(`{"job":"billrun","key":"billrun:2026-01","replica":"replica-x","owner":"replica-x","fence":7,"status":"started"}`)
}

func (t *triggerRecorder) Calls() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.calls...)
}

func newSite(t *testing.T, mutate ...func(*console.Config)) *site {
	t.Helper()
	return newSiteOn(t, nil, mutate...)
}

// newSiteOn is newSite with the given tail (nil: one fed by Publish only).
func newSiteOn(t testing.TB, tail *eventtail.Tail, mutate ...func(*console.Config)) *site {
	t.Helper()
	pg := testenv.Postgres(t)
	s := &site{pool: pg.Pool, store: consoledb.NewStore(pg.Pool), logs: &lockedBuffer{}, trigger: &triggerRecorder{},
		read: testenv.AdminToken(), all: testenv.AdminToken(), mutate: testenv.AdminToken(), tail: tail}
	var err error
	if s.tail == nil {
		s.tail, err = eventtail.New(eventtail.Config{Brokers: []string{"127.0.0.1:1"}, Topic: "unused"})
		require.NoError(t, err)
	}
	s.locker = ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a"})
	t.Cleanup(func() { _ = s.locker.Close() })
	cfg := console.Config{
		Replica: "replica-a",
		Tokens: []adminauth.Token{{Name: "viewer", Scopes: adminauth.Read, Secret: s.read},
			{Name: "ops", Scopes: adminauth.All, Secret: s.all}, {Name: "ci", Scopes: adminauth.Mutate, Secret: s.mutate}},
		Kinds:  []string{"billrun", "msisdn-reaper"},
		Action: console.Action{Kind: "billrun", Path: "/v1/billruns", Field: "period", Label: "period"},
		Log:    slog.New(slog.NewJSONHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, m := range mutate {
		m(&cfg)
	}
	s.con, err = console.New(cfg, console.Deps{Store: s.store, Sessions: s.store, Locks: s.locker, Events: s.tail,
		Trigger: s.trigger.fn})
	require.NoError(t, err)
	s.srv = httptest.NewServer(s.con)
	t.Cleanup(s.srv.Close)
	t.Cleanup(s.con.Shutdown)
	return s
}

// client is a browser-like client: a cookie jar, redirects not followed.
func (s *site) client(t testing.TB) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &http.Client{Jar: jar, Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
}

func (s *site) get(t testing.TB, c *http.Client, path string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(s.srv.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

func (s *site) post(t testing.TB, c *http.Client, path string, form url.Values) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.srv.URL+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", s.srv.URL)
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrfOf(t testing.TB, body string) string {
	t.Helper()
	m := csrfField.FindStringSubmatch(body)
	require.NotNil(t, m, "no csrf field in:\n%s", body)
	return m[1]
}

// login logs c in with token and returns the session's CSRF token.
func (s *site) login(t testing.TB, c *http.Client, token string) (*http.Response, string) {
	t.Helper()
	_, body := s.get(t, c, "/ui/login")
	resp, body := s.post(t, c, "/ui/login", url.Values{"csrf": {csrfOf(t, body)}, "token": {token}})
	return resp, body
}

func (s *site) loggedIn(t *testing.T, token string) (*http.Client, string) {
	t.Helper()
	c := s.client(t)
	resp, _ := s.login(t, c, token)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "/ui/", resp.Header.Get("Location"))
	_, body := s.get(t, c, "/ui/")
	return c, csrfOf(t, body)
}

// paths are every console path; none may show data without a session.
var paths = []string{"/ui/", "/ui/locks", "/ui/runs/billrun", "/ui/runs/billrun/2026-01", "/ui/runs/billrun/billrun:2026-01",
	"/ui/events", "/ui/logout", "/ui/static/console.js", "/ui/static/console.css", "/ui/nothing-here", "/ui/runs/nokind"}

func TestWithoutASessionEveryPathButTheLoginRedirects(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	_, err := s.locker.Acquire(context.Background(), "billrun:2026-01", 0)
	require.NoError(t, err)
	c := s.client(t)
	for _, p := range paths {
		resp, body := s.get(t, c, p)
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, p)
		require.Equal(t, "/ui/login", resp.Header.Get("Location"), p)
		require.NotContains(t, body, "billrun:2026-01", p)
		require.NotContains(t, body, "replica-a", p)
	}
	for _, p := range []string{"/ui/logout", "/ui/trigger"} {
		resp, _ := s.post(t, c, p, url.Values{"period": {"2026-01"}})
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, p)
	}
	resp, body := s.get(t, c, "/ui/stream")
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	require.NotContains(t, body, "event:")
	resp, body = s.get(t, c, "/ui/login")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, `name="token"`)
	require.Empty(t, s.trigger.Calls())
}

func TestLoginSetsAStrictHttpOnlyCookieAndLogoutEndsIt(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	c := s.client(t)
	resp, _ := s.login(t, c, s.read)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	var ck *http.Cookie
	for _, x := range resp.Cookies() {
		if x.Name == console.CookieName {
			ck = x
		}
	}
	require.NotNil(t, ck, "no session cookie")
	require.True(t, ck.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	require.False(t, ck.Secure, "plain HTTP: not Secure")
	require.Equal(t, "/ui/", ck.Path)
	require.NotContains(t, ck.Value, s.read)

	resp, body := s.get(t, c, "/ui/")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, "viewer (read)")
	require.NotContains(t, body, `id="trigger"`, "no action without the mutate scope")

	// The session is server-side: the cookie alone, replayed after logout,
	// is refused.
	resp, _ = s.post(t, c, "/ui/logout", url.Values{"csrf": {csrfOf(t, body)}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "/ui/login", resp.Header.Get("Location"))
	replay := s.client(t)
	u, _ := url.Parse(s.srv.URL + "/ui/")
	replay.Jar.SetCookies(u, []*http.Cookie{{Name: console.CookieName, Value: ck.Value, Path: "/ui/"}})
	resp, _ = s.get(t, replay, "/ui/")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "a logged-out session must be refused")

	logs := s.logs.String()
	require.Contains(t, logs, `"msg":"console_login"`)
	require.Contains(t, logs, `"msg":"console_logout"`)
	require.NotContains(t, logs, s.read, "the token is never logged")
	require.NotContains(t, logs, ck.Value, "the session id is never logged")
}

func TestCookieIsSecureUnderTLS(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	tls := httptest.NewTLSServer(s.con)
	t.Cleanup(tls.Close)
	c := tls.Client()
	jar, _ := cookiejar.New(nil)
	c.Jar = jar
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Get(tls.URL + "/ui/login")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	req, _ := http.NewRequest(http.MethodPost, tls.URL+"/ui/login",
		strings.NewReader(url.Values{"csrf": {csrfOf(t, string(b))}, "token": {s.read}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", tls.URL)
	resp, err = c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	found := false
	for _, x := range resp.Cookies() {
		if x.Name == console.CookieName {
			found = true
			require.True(t, x.Secure, "a cookie set over TLS is Secure")
		}
	}
	require.True(t, found)
}

func TestLoginRefusals(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	c := s.client(t)
	bogus := strings.Repeat("z", 40)
	for _, tok := range []string{bogus, s.mutate, ""} {
		resp, body := s.login(t, c, tok)
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
		require.Contains(t, body, "lacks the read scope")
		resp, _ = s.get(t, c, "/ui/")
		require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	}
	// Without the login form's CSRF cookie and field.
	resp, _ := s.post(t, s.client(t), "/ui/login", url.Values{"token": {s.read}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	// A token in a URL is refused unread, on any path.
	for _, p := range []string{"/ui/login?token=" + s.read, "/ui/?token=" + s.read} {
		resp, body := s.get(t, s.client(t), p)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, p)
		require.NotContains(t, body, s.read)
	}
	logs := s.logs.String()
	require.Contains(t, logs, `"reason":"invalid_token"`)
	require.Contains(t, logs, `"reason":"missing_scope"`)
	require.Contains(t, logs, `"principal":"ci"`)
	for _, tok := range []string{s.read, s.mutate, bogus} {
		require.NotContains(t, logs, tok, "a token is never logged")
	}
}

func TestEveryAnswerCarriesAStrictCSP(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	c, _ := s.loggedIn(t, s.read)
	for _, p := range append([]string{"/ui/login"}, paths...) {
		resp, body := s.get(t, c, p)
		csp := resp.Header.Get("Content-Security-Policy")
		require.Contains(t, csp, "script-src 'self'", p)
		require.Contains(t, csp, "style-src 'self'", p)
		require.NotContains(t, csp, "unsafe-inline", p)
		require.Contains(t, csp, "frame-ancestors 'none'", p)
		require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), p)
		require.NotRegexp(t, `<script>|<script [^>]*>[^<]|<style|style="|\son[a-z]+="`, body, "no inline script, style or handler on %s", p)
	}
}

func TestTheActionNeedsTheMutateScopeAndTheSessionsCSRFToken(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	viewer, viewerCSRF := s.loggedIn(t, s.read)
	resp, body := s.post(t, viewer, "/ui/trigger", url.Values{"csrf": {viewerCSRF}, "period": {"2026-01"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Contains(t, body, "no mutate scope")

	ops, csrf := s.loggedIn(t, s.all)
	_, page := s.get(t, ops, "/ui/")
	require.Contains(t, page, `id="trigger"`)
	resp, _ = s.post(t, ops, "/ui/trigger", url.Values{"csrf": {"not-the-token"}, "period": {"2026-01"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	resp, _ = s.post(t, ops, "/ui/trigger", url.Values{"csrf": {viewerCSRF}, "period": {"2026-01"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "another session's CSRF token")
	// A cross-origin post with the right token is refused too.
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/ui/trigger",
		strings.NewReader(url.Values{"csrf": {csrf}, "period": {"2026-01"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	r2, err := ops.Do(req)
	require.NoError(t, err)
	r2.Body.Close()
	require.Equal(t, http.StatusForbidden, r2.StatusCode)
	require.Empty(t, s.trigger.Calls())

	resp, body = s.post(t, ops, "/ui/trigger", url.Values{"csrf": {csrf}, "period": {"2026-01"}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, "202 Accepted")
	resp, body = s.post(t, ops, "/ui/trigger", url.Values{"csrf": {csrf}, "period": {"2026-01"}})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, "409 Conflict")
	require.Contains(t, body, "already_owned: owner replica-x")
	require.Equal(t, []string{`ops /v1/billruns {"period":"2026-01"}`, `ops /v1/billruns {"period":"2026-01"}`}, s.trigger.Calls())
}

func TestLocksPageFiltersByKindAndKey(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	ctx := context.Background()
	for _, k := range []string{"billrun:2026-01", "billrun:2026-02", "msisdn-reaper:sweep"} {
		_, err := s.locker.Acquire(ctx, k, 0)
		require.NoError(t, err)
	}
	c, _ := s.loggedIn(t, s.read)
	_, body := s.get(t, c, "/ui/locks")
	require.Contains(t, body, "3 of 3 held locks")
	_, body = s.get(t, c, "/ui/locks?kind=billrun")
	require.Contains(t, body, "2 of 3 held locks")
	require.NotContains(t, body, ">msisdn-reaper:sweep<")
	_, body = s.get(t, c, "/ui/locks?key=2026-02")
	require.Contains(t, body, "1 of 3 held locks")
	require.Contains(t, body, ">billrun:2026-02<")
	require.Contains(t, body, ">replica-a<")
}

// sse reads a stream's messages.
type sse struct {
	resp *http.Response
	sc   *bufio.Scanner
}

func (s *site) openStream(t *testing.T, c *http.Client, query string) *sse {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.srv.URL+"/ui/stream"+query, nil)
	require.NoError(t, err)
	cl := *c
	cl.Timeout = 0
	resp, err := cl.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	return &sse{resp: resp, sc: sc}
}

// next returns the next message's event name and data.
func (e *sse) next(t *testing.T) (string, string) {
	t.Helper()
	var name, data string
	for e.sc.Scan() {
		line := e.sc.Text()
		switch {
		case line == "" && name != "":
			return name, data
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
		}
	}
	t.Fatalf("the stream ended: %v", e.sc.Err())
	return "", ""
}

func TestStreamTailsEventsFilteredByKey(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	c, _ := s.loggedIn(t, s.read)
	st := s.openStream(t, c, "?key=billrun:")
	name, _ := st.next(t)
	require.Equal(t, "hello", name)
	require.Eventually(t, func() bool { return s.tail.Subscribers() == 1 }, 10*time.Second, 10*time.Millisecond)
	s.tail.Publish([]byte(`{"type":"ownership.acquired","subject":"msisdn-reaper:sweep","data":{}}`))
	s.tail.Publish([]byte(`{"type":"ownership.acquired","subject":"billrun:2026-01","data":{"replica":"replica-b"}}`))
	name, data := st.next(t)
	require.Equal(t, "ownership", name)
	require.Contains(t, data, "billrun:2026-01", "the reaper's event is filtered out")
	require.Contains(t, data, "replica-b")
}

// A stream whose reader does not keep up loses events, and is told so;
// the tail never waits for it.
func TestSlowStreamIsToldItDroppedEvents(t *testing.T) {
	t.Parallel()
	s := newSite(t, func(c *console.Config) { c.StreamBuffer = 1 })
	c, _ := s.loggedIn(t, s.read)
	st := s.openStream(t, c, "")
	name, _ := st.next(t)
	require.Equal(t, "hello", name)
	require.Eventually(t, func() bool { return s.tail.Subscribers() == 1 }, 10*time.Second, 10*time.Millisecond)
	start := time.Now()
	big := `{"type":"run.completed","subject":"billrun:2026-01","data":{"pad":"` + strings.Repeat("x", 64<<10) + `"}}`
	for range 400 { // ~25 MiB: more than the socket buffers hold while nobody reads
		s.tail.Publish([]byte(big))
	}
	require.Less(t, time.Since(start), 5*time.Second, "publishing must not wait for a reader")
	for {
		name, data := st.next(t)
		if name == "dropped" {
			require.Regexp(t, `^\{"dropped":[1-9][0-9]*\}$`, data)
			return
		}
	}
}

func TestStreamsAreBounded(t *testing.T) {
	t.Parallel()
	s := newSite(t, func(c *console.Config) { c.MaxStreams = 2 })
	c, _ := s.loggedIn(t, s.read)
	s.openStream(t, c, "")
	s.openStream(t, c, "")
	resp, _ := s.get(t, c, "/ui/stream")
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "10", resp.Header.Get("Retry-After"))
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  console.Config
		want string
	}{
		{console.Config{SessionTTL: time.Second}, "SessionTTL 1s"},
		{console.Config{MaxStreams: -1}, "MaxStreams -1"},
		{console.Config{PageSize: 500}, "PageSize 500"},
		{console.Config{Action: console.Action{Kind: "billrun"}}, "Action needs"},
	} {
		require.ErrorContains(t, c.cfg.Validate(), c.want)
	}
	require.NoError(t, console.Config{}.Validate())
}

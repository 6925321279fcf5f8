package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/adminauth"
	"github.com/telco-platform/coordinator/internal/console"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// replica is another console on the same database (another replica behind
// the load balancer, or this one restarted with new configuration).
func (s *site) replica(t *testing.T, tokens []adminauth.Token, deps func(*console.Deps)) *httptest.Server {
	t.Helper()
	d := console.Deps{Store: s.store, Sessions: s.store, Locks: s.locker, Events: s.tail, Trigger: s.trigger.fn}
	if deps != nil {
		deps(&d)
	}
	c, err := console.New(console.Config{Replica: "replica-b", Tokens: tokens, Kinds: []string{"billrun", "msisdn-reaper"},
		Action: console.Action{Kind: "billrun", Path: "/v1/billruns", Field: "period", Label: "period"}}, d)
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	t.Cleanup(c.Shutdown)
	return srv
}

func sessionCookieOf(t *testing.T, s *site, c *http.Client) *http.Cookie {
	t.Helper()
	u, err := url.Parse(s.srv.URL + "/ui/")
	require.NoError(t, err)
	for _, ck := range c.Jar.Cookies(u) {
		if ck.Name == console.CookieName {
			return ck
		}
	}
	t.Fatal("no session cookie")
	return nil
}

func getWithCookie(t *testing.T, base, path string, ck *http.Cookie) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	require.NoError(t, err)
	req.AddCookie(ck)
	c := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp, b.String()
}

// A token rotated because it leaked keeps its name: the sessions opened
// with the old secret must end with it, not live on for SessionTTL.
func TestARotatedTokenEndsTheSessionsOpenedWithIt(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	c, _ := s.loggedIn(t, s.all)
	ck := sessionCookieOf(t, s, c)

	same := s.replica(t, []adminauth.Token{{Name: "ops", Scopes: adminauth.All, Secret: s.all}}, nil)
	resp, body := getWithCookie(t, same.URL, "/ui/", ck)
	require.Equal(t, http.StatusOK, resp.StatusCode, "another replica with the same tokens knows the session")
	require.Contains(t, body, "ops (read, mutate)")

	rotated := s.replica(t, []adminauth.Token{{Name: "ops", Scopes: adminauth.All, Secret: testenv.AdminToken()}}, nil)
	resp, body = getWithCookie(t, rotated.URL, "/ui/", ck)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "a session of the old secret, after the rotation")
	require.Equal(t, "/ui/login", resp.Header.Get("Location"))
	require.NotContains(t, body, "replica-b")
	resp, _ = getWithCookie(t, rotated.URL, "/ui/stream", ck)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

// The live tail's records come from whoever can write the events topic:
// a CloudEvent spread over lines (valid JSON) must still be one SSE
// message whose data is the event, never a torn frame or a second message.
func TestAMultiLineEventIsOneStreamMessage(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	c, _ := s.loggedIn(t, s.read)
	st := s.openStream(t, c, "")
	name, _ := st.next(t)
	require.Equal(t, "hello", name)
	require.Eventually(t, func() bool { return s.tail.Subscribers() == 1 }, 10*time.Second, 10*time.Millisecond)
	s.tail.Publish([]byte("{\"type\":\"ownership.acquired\",\r\n\n\"subject\":\"billrun:2026-01\",\n\"data\":{\"owner\":\"r1\"}\n}"))
	s.tail.Publish([]byte(`{"type":"ownership.released","subject":"billrun:2026-01","data":{}}`))
	for _, want := range []string{"ownership.acquired", "ownership.released"} {
		name, data := st.next(t)
		require.Equal(t, "ownership", name)
		var ev struct{ Type, Subject string }
		require.NoError(t, json.Unmarshal([]byte(data), &ev), "one message, the whole event: %q", data)
		require.Equal(t, want, ev.Type)
		require.Equal(t, "billrun:2026-01", ev.Subject)
	}
}

// hostileLocks are locks whose keys and owners other writers chose (a
// Redisson client of the same Redis, say).
type hostileLocks struct{}

func (hostileLocks) Locks(context.Context) ([]ownership.LockInfo, error) {
	return []ownership.LockInfo{{Key: `billrun:<script>alert("k")</script>`, Owner: `"><img src=x onerror=alert(1)>`, Fence: 1, Holds: 1, TTL: time.Second}}, nil
}

// Every value a page shows comes from Redis, Kafka or Postgres rows that
// other writers control: each is escaped, none becomes markup.
func TestValuesFromTheStoresAreEscaped(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	ctx := context.Background()
	const x = `<script>alert(1)</script>"><img src=x onerror=alert(2)>`
	_, err := s.pool.Exec(ctx, `
insert into run_history (job, run_key, outcome, replica, fence, trigger_source, requested_by, principal, started_at, ended_at, counts, error, timeline)
values ('billrun', 'billrun:2026-01', 'failed', $1, 1, $1, $1, $1, now() - interval '1 minute', now(), jsonb_build_object($1::text, 1), $1, '[[1,1,1]]')`, x)
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, `
insert into ownership_events (id, topic_partition, topic_offset, type, run_key, job, replica, event_time, reason, data)
values ('x1', 0, 1, $1, 'billrun:2026-01', 'billrun', $1, now(), $1, jsonb_build_object('owner', $1::text, 'trigger', $1::text, 'detail', $1::text)),
       ('x2', 0, 2, 'trigger.rejected', $1, 'billrun', $1, now(), $1, jsonb_build_object('reason', $1::text))`, x)
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, `
insert into replica_heartbeats (replica, version, started_at, seen_at, ready, dependencies, runs)
values ($1, $1, now(), now(), true, jsonb_build_array(jsonb_build_object('name', $1::text, 'checked', true, 'ok', false)),
        jsonb_build_array(jsonb_build_object('job', 'billrun', 'key', $1::text, 'replica', $1::text, 'trigger', $1::text, 'percent', -1, 'eta_ms', -1)))`, x)
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, `
insert into run_requests (job, run_key, requested_by, trigger_source, last_outcome, last_error)
values ('billrun', $1, $1, $1, $1, $1)`, x)
	require.NoError(t, err)
	s.trigger = &triggerRecorder{}
	srv := s.replica(t, []adminauth.Token{{Name: "ops", Scopes: adminauth.All, Secret: s.all}}, func(d *console.Deps) {
		d.Locks = hostileLocks{}
		d.Trigger = func(context.Context, string, string, []byte) (int, string, []byte) {
			b, _ := json.Marshal(map[string]any{"status": 409, "reason": x, "owner": x, "detail": x, "key": x})
			return http.StatusConflict, "application/problem+json", b
		}
	})
	c, _ := s.loggedIn(t, s.all)
	ck := sessionCookieOf(t, s, c)
	for _, p := range []string{"/ui/", "/ui/locks", "/ui/runs/billrun", "/ui/runs/billrun/2026-01", "/ui/events",
		"/ui/runs/" + url.PathEscape(x), "/ui/events?key=" + url.QueryEscape(x), "/ui/locks?key=" + url.QueryEscape(x)} {
		resp, body := getWithCookie(t, srv.URL, p, ck)
		require.Contains(t, []int{http.StatusOK, http.StatusNotFound}, resp.StatusCode, p)
		require.NotContains(t, body, "<script>alert", p)
		require.NotContains(t, body, "<img", p)
		require.NotContains(t, body, "onerror=alert(2)>", p)
	}
	_, body := getWithCookie(t, srv.URL, "/ui/", ck)
	require.Contains(t, body, "&lt;script&gt;alert(1)&lt;/script&gt;", "shown, escaped")
	// The answer page shows the API's answer, escaped.
	_, page := getWithCookie(t, srv.URL, "/ui/", ck)
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/ui/trigger",
		strings.NewReader(url.Values{"csrf": {csrfOf(t, page)}, "period": {x}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.AddCookie(ck)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	require.Contains(t, b.String(), "409 Conflict")
	require.NotContains(t, b.String(), "<script>alert")
	require.NotContains(t, b.String(), "<img")
}

// The answer page is the API's answer as the API gave it: its status, its
// reason and detail (422 period_not_closed), a plain-text 503.
func TestTheAnswerPageShowsTheAPIsAnswer(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	answers := []struct {
		status int
		ctype  string
		body   string
		want   []string
	}{
		{http.StatusUnprocessableEntity, "application/problem+json",
			`{"status":422,"code":"BAD_INPUT","reason":"period_not_closed","detail":"period 2026-12 is not closed yet in Europe/Paris","fields":{"period":"2026-12"}}`,
			[]string{"422 Unprocessable Entity", "period 2026-12 is not closed yet in Europe/Paris", "period_not_closed"}},
		{http.StatusServiceUnavailable, "application/problem+json",
			`{"status":503,"code":"LOCK_ACQUISITION_FAILED","reason":"unavailable","detail":"the lock backend is unavailable"}`,
			[]string{"503 Service Unavailable", "the lock backend is unavailable", "unavailable"}},
		{http.StatusServiceUnavailable, "text/plain", "the replica is starting", []string{"503 Service Unavailable", "the replica is starting"}},
	}
	i := 0
	srv := s.replica(t, []adminauth.Token{{Name: "ops", Scopes: adminauth.All, Secret: s.all}}, func(d *console.Deps) {
		d.Trigger = func(context.Context, string, string, []byte) (int, string, []byte) {
			a := answers[i]
			return a.status, a.ctype, []byte(a.body)
		}
	})
	c, _ := s.loggedIn(t, s.all)
	ck := sessionCookieOf(t, s, c)
	for i = range answers {
		_, page := getWithCookie(t, srv.URL, "/ui/", ck)
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/ui/trigger",
			strings.NewReader(url.Values{"csrf": {csrfOf(t, page)}, "period": {"2026-12"}}.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(ck)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		resp.Body.Close()
		require.Contains(t, b.String(), `data-status="`+strconv.Itoa(answers[i].status)+`"`)
		for _, w := range answers[i].want {
			require.Contains(t, b.String(), w, "answer %d", i)
		}
	}
}

// Odd paths and parameters: no file is served from outside the embedded
// static set, an unknown kind or a key that is no lock key is a 404 page,
// a page parameter that is not a run id is a 400, a huge one is harmless.
func TestOddPathsAndParameters(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	c, _ := s.loggedIn(t, s.read)
	for p, want := range map[string]int{
		"/ui/static/..%2Ftemplates%2Flayout.html":              http.StatusNotFound,
		"/ui/static/%2e%2e%2fconsole.go":                       http.StatusNotFound,
		"/ui/static/layout.html":                               http.StatusNotFound,
		"/ui/runs/nokind":                                      http.StatusNotFound,
		"/ui/runs/nokind/2026-01":                              http.StatusNotFound,
		"/ui/runs/billrun/..%2F..%2Fetc%2Fpasswd":              http.StatusOK, // a valid lock key, read from Postgres only
		"/ui/runs/billrun/" + strings.Repeat("9", 10_000):      http.StatusNotFound,
		"/ui/runs/billrun?before=-1":                           http.StatusBadRequest,
		"/ui/runs/billrun?before=99999999999999999999999":      http.StatusBadRequest,
		"/ui/runs/billrun?before=9223372036854775807":          http.StatusOK,
		"/ui/runs/billrun?key=" + strings.Repeat("k", 100_000): http.StatusOK,
		"/ui/events?key=" + strings.Repeat("k", 100_000):       http.StatusOK,
	} {
		resp, body := s.get(t, c, p)
		require.Equal(t, want, resp.StatusCode, "%.80s", p)
		require.NotEmpty(t, resp.Header.Get("Content-Security-Policy"), "%.80s", p)
		require.NotContains(t, body, "{{define", "%.80s", p)
		require.NotContains(t, body, "root:", "%.80s", p)
		require.NotContains(t, body, "package console", "%.80s", p)
	}
	// The session's CSRF token and ids never reach a URL: no form posts a GET.
	_, page := s.get(t, c, "/ui/")
	require.NotRegexp(t, `href="[^"]*csrf`, page)
}

// A stream ends when its session does: logged out elsewhere (any
// replica), it says bye at its next session check instead of tailing on.
func TestAStreamEndsWhenItsSessionEnds(t *testing.T) {
	t.Parallel()
	s := newSite(t, func(c *console.Config) { console.SetStreamSessionCheck(c, 100*time.Millisecond) })
	c, csrf := s.loggedIn(t, s.read)
	st := s.openStream(t, c, "")
	name, _ := st.next(t)
	require.Equal(t, "hello", name)
	other, _ := s.loggedIn(t, s.read) // another session of the same token goes on
	st2 := s.openStream(t, other, "")
	name, _ = st2.next(t)
	require.Equal(t, "hello", name)

	resp, _ := s.post(t, c, "/ui/logout", url.Values{"csrf": {csrf}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	for {
		name, data := st.next(t)
		if name == "bye" {
			require.Contains(t, data, "session ended")
			break
		}
	}
	require.Eventually(t, func() bool { return s.con.Streams() == 1 && s.tail.Subscribers() == 1 }, 10*time.Second, 10*time.Millisecond,
		"the ended stream's goroutine and subscription are gone, the other session's stay")
}

// Streams whose clients go away free their slot and subscription.
func TestStreamsEndWithTheirClients(t *testing.T) {
	t.Parallel()
	s := newSite(t, func(c *console.Config) { c.MaxStreams = 5 })
	c, _ := s.loggedIn(t, s.read)
	for round := range 3 {
		var open []*sse
		for range 5 {
			open = append(open, s.openStream(t, c, ""))
		}
		require.Eventually(t, func() bool { return s.con.Streams() == 5 }, 10*time.Second, 10*time.Millisecond, "round %d", round)
		for _, st := range open {
			require.NoError(t, st.resp.Body.Close())
		}
		require.Eventually(t, func() bool { return s.con.Streams() == 0 && s.tail.Subscribers() == 0 }, 10*time.Second, 10*time.Millisecond,
			"round %d: every stream ended with its client", round)
	}
}

// /ui itself is sent to /ui/ (and a POST to it refused) with the security
// headers of every answer.
func TestUIWithoutItsSlashRedirectsWithTheHeaders(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		req, err := http.NewRequest(m, s.srv.URL+"/ui", nil)
		require.NoError(t, err)
		resp, err := s.client(t).Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		if m == http.MethodGet {
			require.Equal(t, http.StatusMovedPermanently, resp.StatusCode)
			require.Equal(t, "/ui/", resp.Header.Get("Location"))
		}
		require.Equal(t, console.ContentSecurityPolicy, resp.Header.Get("Content-Security-Policy"), m)
	}
}

// One session (a script, a reload loop) cannot take every stream of the
// replica: past its own bound it is refused, and other operators still
// get theirs.
func TestOneSessionCannotTakeEveryStream(t *testing.T) {
	t.Parallel()
	s := newSite(t, func(c *console.Config) { c.MaxStreams = console.MaxStreamsPerSession + 5 })
	greedy, _ := s.loggedIn(t, s.read)
	for range console.MaxStreamsPerSession {
		s.openStream(t, greedy, "")
	}
	resp, _ := s.get(t, greedy, "/ui/stream")
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	require.NotEmpty(t, resp.Header.Get("Retry-After"))
	other, _ := s.loggedIn(t, s.read)
	st := s.openStream(t, other, "")
	name, _ := st.next(t)
	require.Equal(t, "hello", name)
}

// A session id planted before the login (fixation) is never adopted: the
// login mints a new one, and the planted one opens nothing.
func TestLoginNeverAdoptsAPlantedSessionID(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	c := s.client(t)
	u, err := url.Parse(s.srv.URL + "/ui/")
	require.NoError(t, err)
	const planted = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	c.Jar.SetCookies(u, []*http.Cookie{{Name: console.CookieName, Value: planted, Path: "/ui/"}})
	resp, _ := s.login(t, c, s.all)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	minted := sessionCookieOf(t, s, c)
	require.NotEqual(t, planted, minted.Value)
	require.Len(t, minted.Value, 43, "256 random bits, base64url")
	resp, _ = getWithCookie(t, s.srv.URL, "/ui/", &http.Cookie{Name: console.CookieName, Value: planted})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, "the planted id is no session")
	resp, _ = getWithCookie(t, s.srv.URL, "/ui/", minted)
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// A token pasted into the action's field by mistake is neither sent on
// nor logged: the console's own log line would have been the one place
// it leaked.
func TestATokenPastedIntoTheActionIsNotLogged(t *testing.T) {
	t.Parallel()
	s := newSite(t)
	ops, csrf := s.loggedIn(t, s.all)
	for _, tok := range []string{s.all, s.read} {
		resp, body := s.post(t, ops, "/ui/trigger", url.Values{"csrf": {csrf}, "period": {tok}})
		require.Equal(t, http.StatusBadRequest, resp.StatusCode)
		require.NotContains(t, body, tok)
	}
	require.Empty(t, s.trigger.Calls(), "not sent to the API")
	logs := s.logs.String()
	require.NotContains(t, logs, s.all)
	require.NotContains(t, logs, s.read)
}

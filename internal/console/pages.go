package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/telco-platform/coordinator/internal/health"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// renderer holds every page's template, each with the layout.
type renderer struct {
	pages map[string]*template.Template
}

func newRenderer() (*renderer, error) {
	layout, err := fs.ReadFile(assets, "templates/layout.html")
	if err != nil {
		return nil, err
	}
	names, err := fs.Glob(assets, "templates/*.html")
	if err != nil {
		return nil, err
	}
	r := &renderer{pages: map[string]*template.Template{}}
	for _, n := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if name == "layout" {
			continue
		}
		body, err := fs.ReadFile(assets, n)
		if err != nil {
			return nil, err
		}
		t, err := template.New("layout").Parse(string(layout))
		if err == nil {
			_, err = t.New(name).Parse(string(body))
		}
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		r.pages[name] = t
	}
	return r, nil
}

// render executes page name into a buffer first, so a template error is a
// 500 rather than half a page.
func (r *renderer) render(w http.ResponseWriter, status int, name string, p page) {
	t, ok := r.pages[name]
	if !ok {
		http.Error(w, "no template "+name, http.StatusInternalServerError)
		return
	}
	p.Content = name
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", p); err != nil {
		http.Error(w, "the page could not be rendered: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// page is what the layout shows around a page's Data.
type page struct {
	Title, Replica, Principal string
	Mutate                    bool
	CSRF                      string
	Nav                       string
	Kinds                     []string
	Content                   string
	// Problems are parts of the page that could not be read (a store down):
	// the rest still shows.
	Problems []string
	Data     any
}

func (c *Console) page(title string, s Session, data any) page {
	return page{Title: title, Replica: c.cfg.Replica, Principal: s.Principal, Mutate: s.Mutate, CSRF: s.CSRF,
		Kinds: c.cfg.Kinds, Data: data}
}

func (c *Console) notFound(w http.ResponseWriter, _ *http.Request, s Session, msg string) {
	c.pages.render(w, http.StatusNotFound, "notfound", c.page("Not found", s, msg))
}

// readTimeout bounds every read a page makes.
const readTimeout = 5 * time.Second

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func fmtDur(d time.Duration) string {
	switch {
	case d < 0:
		return "—"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

func fmtCounts(m map[string]int64) string {
	if len(m) == 0 {
		return "—"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + strconv.FormatInt(m[k], 10)
	}
	return strings.Join(parts, " ")
}

// runLink is a run's page: the key without its kind's prefix.
func runLink(job, key string) string {
	return PathRuns + url.PathEscape(job) + "/" + url.PathEscape(strings.TrimPrefix(key, job+":"))
}

// kindOf is a lock key's kind (its namespace).
func kindOf(key string) string {
	k, _, _ := strings.Cut(key, ":")
	return k
}

// ---------------------------------------------------------------- overview

type replicaView struct {
	ID, Version, State, Seen, Started string
	Ready                             bool
	Down                              []string
	Runs                              int
}

type inflightView struct {
	Job, Key, Link, Replica, Trigger, RequestedBy, Started string
	Fence                                                  int64
	// Percent is 0-100 for the bar; Known false while the total is not.
	Percent              float64
	Known                bool
	Progress, Rate, ETA  string
	Batches, Total, Rows int64
}

type pendingView struct {
	Job, Key, Link, Outcome, Error, Accepted, Next, Source, RequestedBy string
	Attempts                                                            int
	Permanent                                                           bool
}

type overviewView struct {
	Replicas    []replicaView
	Deps        []health.Result
	HasHealth   bool
	InFlight    []inflightView
	Pending     []pendingView
	Failures    []runView
	DeadLetters []DeadLetters
	DLQTotal    int64
	Action      Action
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request, s Session) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	p := c.page("Overview", s, nil)
	p.Nav = "overview"
	v := overviewView{Action: c.cfg.Action}
	now := c.cfg.Now()
	reps, err := c.deps.Store.Replicas(ctx)
	if err != nil {
		p.Problems = append(p.Problems, "replicas: "+err.Error())
	}
	for _, rep := range reps {
		rv := replicaView{ID: rep.ID, Version: rep.Version, Seen: fmtDur(rep.Age) + " ago", Started: fmtTime(rep.Started),
			Ready: rep.Ready, Runs: len(rep.Runs)}
		switch {
		case rep.Stopped:
			rv.State = "stopped"
		case rep.Age > 3*c.cfg.HeartbeatInterval:
			rv.State = "missing"
		default:
			rv.State = "up"
		}
		for _, d := range rep.Dependencies {
			if d.Checked && !d.OK {
				rv.Down = append(rv.Down, d.Name)
			}
		}
		v.Replicas = append(v.Replicas, rv)
	}
	if c.deps.Health != nil {
		v.HasHealth, v.Deps = true, c.deps.Health.Snapshot()
	}
	for _, f := range c.inFlight(reps) {
		v.InFlight = append(v.InFlight, inflightOf(f, now))
	}
	pending, err := c.deps.Store.Pending(ctx)
	if err != nil {
		p.Problems = append(p.Problems, "incomplete runs: "+err.Error())
	}
	for _, q := range pending {
		pv := pendingView{Job: q.Job, Key: q.Key, Link: runLink(q.Job, q.Key), Outcome: q.Outcome, Error: q.Error,
			Accepted: fmtTime(q.AcceptedAt), Source: q.Source, RequestedBy: q.RequestedBy, Attempts: q.Attempts,
			Permanent: q.Permanent, Next: fmtTime(q.NextAttempt)}
		if q.Permanent {
			pv.Next = "none: permanent, pages"
		} else if !q.NextAttempt.After(now) {
			pv.Next = "due now"
		}
		v.Pending = append(v.Pending, pv)
	}
	fails, err := c.deps.Store.Failures(ctx, now.Add(-24*time.Hour), 20)
	if err != nil {
		p.Problems = append(p.Problems, "failed runs: "+err.Error())
	}
	for _, f := range fails {
		v.Failures = append(v.Failures, runViewOf(f))
	}
	dl, err := c.deps.Store.DeadLetters(ctx, now.Add(-time.Hour))
	if err != nil {
		p.Problems = append(p.Problems, "dead letters: "+err.Error())
	}
	v.DeadLetters = dl
	for _, d := range dl {
		v.DLQTotal += d.Count
	}
	p.Data = v
	c.pages.render(w, http.StatusOK, "overview", p)
}

// inFlight is every replica's runs in flight: this replica's from its
// runner (fresh), the others' from their latest heartbeat (replicas
// stopped or missing have none).
func (c *Console) inFlight(reps []Replica) []InFlight {
	var out []InFlight
	if c.deps.InFlight != nil {
		out = append(out, c.deps.InFlight()...)
	}
	for _, rep := range reps {
		if rep.ID == c.cfg.Replica || rep.Stopped || rep.Age > 3*c.cfg.HeartbeatInterval {
			continue
		}
		out = append(out, rep.Runs...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

func inflightOf(f InFlight, now time.Time) inflightView {
	v := inflightView{Job: f.Job, Key: f.Key, Link: runLink(f.Job, f.Key), Replica: f.Replica, Trigger: f.Trigger,
		RequestedBy: f.RequestedBy, Started: fmtTime(f.Started), Fence: f.Fence, Batches: f.Batches, Total: f.Total,
		Rows: f.Rows, Rate: strconv.FormatFloat(f.RowsPerSecond, 'f', 1, 64) + " rows/s", ETA: "—"}
	if f.Percent >= 0 {
		v.Known, v.Percent = true, f.Percent
		v.Progress = fmt.Sprintf("%.1f%% (%d of %d batches)", f.Percent, f.Batches, f.Total)
	} else {
		v.Progress = fmt.Sprintf("%d batches, total not known yet", f.Batches)
	}
	if f.ETAMS >= 0 {
		v.ETA = fmtDur(time.Duration(f.ETAMS) * time.Millisecond)
	}
	_ = now
	return v
}

// progress is the runs in flight for the stream's progress messages,
// shared by every stream and refreshed at most twice a second.
func (c *Console) progress(ctx context.Context) []InFlight {
	c.progMu.Lock()
	defer c.progMu.Unlock()
	if time.Since(c.progAt) < 500*time.Millisecond {
		return c.progLast
	}
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	reps, err := c.deps.Store.Replicas(ctx)
	if err != nil {
		reps = nil // this replica's own runs still show
	}
	c.progLast, c.progAt = c.inFlight(reps), time.Now()
	return c.progLast
}

// ------------------------------------------------------------------- locks

type lockView struct {
	Key, Kind, Link, Owner, TTL string
	Fence, Holds, Waiters       int64
}

type locksView struct {
	Kind, Key string
	Locks     []lockView
	Total     int
	Available bool
}

func (c *Console) locks(w http.ResponseWriter, r *http.Request, s Session) {
	p := c.page("Locks", s, nil)
	p.Nav = "locks"
	v := locksView{Kind: r.URL.Query().Get("kind"), Key: strings.TrimSpace(r.URL.Query().Get("key")), Available: c.deps.Locks != nil}
	if c.deps.Locks != nil {
		ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
		defer cancel()
		locks, err := c.deps.Locks.Locks(ctx)
		if err != nil {
			p.Problems = append(p.Problems, "locks: "+err.Error())
		}
		v.Total = len(locks)
		for _, l := range locks {
			if !lockMatches(l, v.Kind, v.Key) {
				continue
			}
			k := kindOf(l.Key)
			v.Locks = append(v.Locks, lockView{Key: l.Key, Kind: k, Link: runLink(k, l.Key), Owner: l.Owner,
				TTL: fmtDur(l.TTL), Fence: l.Fence, Holds: l.Holds, Waiters: l.Waiters})
		}
	}
	p.Data = v
	c.pages.render(w, http.StatusOK, "locks", p)
}

func lockMatches(l ownership.LockInfo, kind, key string) bool {
	if kind != "" && kindOf(l.Key) != kind {
		return false
	}
	return key == "" || strings.Contains(l.Key, key)
}

// -------------------------------------------------------------------- runs

type answerView struct {
	Action               Action
	Value                string
	Status               int
	StatusText           string
	Outcome, Owner, Body string
	Detail               string
	Accepted             bool
	Link                 string
}

// maxActionValue bounds the action's field (a period is 7 bytes).
const maxActionValue = 64

// trigger starts the action through the admin API's own code and shows
// its answer as the API gave it.
func (c *Console) trigger(w http.ResponseWriter, r *http.Request, s Session) {
	a := c.cfg.Action
	if a == (Action{}) || c.deps.Trigger == nil {
		c.notFound(w, r, s, "this console has no action")
		return
	}
	if !s.Mutate {
		c.metrics.refused("missing_scope")
		c.cfg.Log.Warn("console_refused", "reason", "missing_scope", "principal", s.Principal, "route", r.Pattern)
		p := c.page("Refused", s, "The token "+s.Principal+" has no mutate scope: it may look, not start runs.")
		c.pages.render(w, http.StatusForbidden, "refused", p)
		return
	}
	value := strings.TrimSpace(r.PostForm.Get(a.Field))
	if value == "" || len(value) > maxActionValue {
		p := c.page("Refused", s, fmt.Sprintf("%s: give a value of 1 to %d characters.", a.Label, maxActionValue))
		c.pages.render(w, http.StatusBadRequest, "refused", p)
		return
	}
	if _, isToken := c.tokens.Authenticate(value); isToken {
		// A token pasted into the wrong field: the value goes into the
		// log line below and the API's answer, so it stops here, unsaid.
		c.metrics.refused("token_in_field")
		c.cfg.Log.Warn("console_refused", "reason", "token_in_field", "principal", s.Principal, "route", r.Pattern)
		p := c.page("Refused", s, fmt.Sprintf("%s: that is an admin token, not a %s. It was not sent or logged; if it was exposed, rotate it.",
			a.Label, a.Field))
		c.pages.render(w, http.StatusBadRequest, "refused", p)
		return
	}
	body, _ := json.Marshal(map[string]string{a.Field: value})
	status, ctype, answer := c.deps.Trigger(r.Context(), s.Principal, a.Path, body)
	c.cfg.Log.Info("console_trigger", "principal", s.Principal, "kind", a.Kind, a.Field, value, "status", status)
	v := answerView{Action: a, Value: value, Status: status, StatusText: http.StatusText(status), Accepted: status == http.StatusAccepted}
	var fields map[string]any
	if strings.Contains(ctype, "json") && json.Unmarshal(answer, &fields) == nil {
		str := func(k string) string { s, _ := fields[k].(string); return s }
		v.Outcome = cmpOr(str("reason"), str("outcome"), str("status"))
		v.Owner, v.Detail = str("owner"), str("detail")
		if key := cmpOr(str("key"), str("lockKey")); key != "" {
			v.Link = runLink(a.Kind, key)
		}
	}
	var pretty bytes.Buffer
	if json.Indent(&pretty, answer, "", "  ") == nil {
		v.Body = pretty.String()
	} else {
		v.Body = string(answer)
	}
	if v.Link == "" {
		v.Link = runLink(a.Kind, a.Kind+":"+value)
	}
	p := c.page("Trigger: "+a.Kind, s, v)
	c.pages.render(w, http.StatusOK, "answer", p)
}

func cmpOr(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

type loginView struct {
	CSRF, Error string
}

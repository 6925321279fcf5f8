package console

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/telco-platform/coordinator/internal/ownership"
)

// The run pages: the run history, one run with its timeline, and the
// events (the other pages: pages.go).

type runView struct {
	ID                                         int64
	Job, Key, Short, Link, Outcome, Replica    string
	Trigger, RequestedBy, Principal, RequestID string
	Started, Duration, Counts, Repairs, Error  string
	Fence, LockFence                           int64
	Points                                     string
	MaxBatches                                 int64
	Span                                       string
}

func runViewOf(r Run) runView {
	v := runView{ID: r.ID, Job: r.Job, Key: r.Key, Short: strings.TrimPrefix(r.Key, r.Job+":"), Link: runLink(r.Job, r.Key),
		Outcome: r.Outcome, Replica: r.Replica, Trigger: r.Trigger, RequestedBy: r.RequestedBy, Principal: r.Principal,
		RequestID: r.RequestID, Started: fmtTime(r.Started), Duration: fmtDur(r.Duration()), Counts: fmtCounts(r.Counts),
		Repairs: "—", Error: r.Error, Fence: r.Fence, LockFence: r.LockFence}
	if n, ok := r.Counts["repaired"]; ok {
		v.Repairs = strconv.FormatInt(n, 10)
	}
	v.Points, v.MaxBatches, v.Span = timelinePoints(r.Timeline, r.Duration())
	return v
}

// Chart is the size of a timeline's SVG viewBox.
const chartW, chartH = 600, 120

// timelinePoints draws a run's batches over time as an SVG polyline
// (attributes only: the CSP allows no inline style).
func timelinePoints(tl []Point, d time.Duration) (points string, maxBatches int64, span string) {
	if len(tl) == 0 {
		return "", 0, ""
	}
	end := max(d, tl[len(tl)-1].At, time.Millisecond)
	maxBatches = max(tl[len(tl)-1].Batches, 1)
	var b strings.Builder
	fmt.Fprintf(&b, "0,%d", chartH)
	for _, p := range tl {
		x := float64(p.At) / float64(end) * chartW
		y := chartH - float64(p.Batches)/float64(maxBatches)*(chartH-10)
		fmt.Fprintf(&b, " %.1f,%.1f", x, math.Max(y, 0))
	}
	return b.String(), maxBatches, fmtDur(end)
}

type runsView struct {
	Kind, Key  string
	Runs       []runView
	Next       string
	First      bool
	ActionKind bool
}

func (c *Console) runs(w http.ResponseWriter, r *http.Request, s Session) {
	kind := r.PathValue("kind")
	if !c.kindKnown(kind) {
		c.notFound(w, r, s, "no kind of run named "+kind)
		return
	}
	q := RunQuery{Key: strings.TrimSpace(r.URL.Query().Get("key")), Limit: c.cfg.PageSize}
	if q.Key != "" && !strings.HasPrefix(q.Key, kind+":") {
		q.Key = kind + ":" + q.Key
	}
	if b := r.URL.Query().Get("before"); b != "" {
		n, err := strconv.ParseInt(b, 10, 64)
		if err != nil || n <= 0 {
			http.Error(w, "before: want a run id", http.StatusBadRequest)
			return
		}
		q.Before = n
	}
	p := c.page("Runs: "+kind, s, nil)
	p.Nav = "runs:" + kind
	v := runsView{Kind: kind, Key: strings.TrimPrefix(q.Key, kind+":"), First: q.Before == 0}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	rows, err := c.deps.Store.Runs(ctx, kind, q)
	if err != nil {
		p.Problems = append(p.Problems, "run history: "+err.Error())
	}
	for _, run := range rows {
		v.Runs = append(v.Runs, runViewOf(run))
	}
	if len(rows) == q.Limit {
		next := url.Values{"before": {strconv.FormatInt(rows[len(rows)-1].ID, 10)}}
		if v.Key != "" {
			next.Set("key", v.Key)
		}
		v.Next = PathRuns + url.PathEscape(kind) + "?" + next.Encode()
	}
	p.Data = v
	c.pages.render(w, http.StatusOK, "runs", p)
}

type eventView struct {
	Time, Type, Key, Link, Replica, Owner, Trigger, Detail string
	Fence                                                  int64
	Class                                                  string
}

type runView1 struct {
	Kind, Key, Short string
	InFlight         *inflightView
	Attempts         []runView
	Events           []eventView
	EventsCapped     bool
}

// maxRunEvents bounds the events a run's page shows (the newest).
const maxRunEvents = 1000

func (c *Console) run(w http.ResponseWriter, r *http.Request, s Session) {
	kind, key := r.PathValue("kind"), r.PathValue("key")
	if !c.kindKnown(kind) {
		c.notFound(w, r, s, "no kind of run named "+kind)
		return
	}
	if !strings.HasPrefix(key, kind+":") {
		key = kind + ":" + key
	}
	if err := ownership.ValidateKey(key); err != nil {
		c.notFound(w, r, s, "not a lock key")
		return
	}
	p := c.page(key, s, nil)
	p.Nav = "runs:" + kind
	v := runView1{Kind: kind, Key: key, Short: strings.TrimPrefix(key, kind+":")}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	reps, _ := c.deps.Store.Replicas(ctx)
	for _, f := range c.inFlight(reps) {
		if f.Key == key {
			iv := inflightOf(f, c.cfg.Now())
			v.InFlight = &iv
		}
	}
	rows, err := c.deps.Store.Runs(ctx, kind, RunQuery{Key: key, Limit: MaxAttemptsShown})
	if err != nil {
		p.Problems = append(p.Problems, "run history: "+err.Error())
	}
	for i := len(rows) - 1; i >= 0; i-- { // oldest first, like the events
		v.Attempts = append(v.Attempts, runViewOf(rows[i]))
	}
	evs, err := c.deps.Store.Events(ctx, key, maxRunEvents)
	if err != nil {
		p.Problems = append(p.Problems, "events: "+err.Error())
	}
	v.EventsCapped = len(evs) == maxRunEvents
	for _, e := range evs {
		v.Events = append(v.Events, eventViewOf(e))
	}
	p.Data = v
	c.pages.render(w, http.StatusOK, "run", p)
}

// MaxAttemptsShown bounds the runs of one key a run's page shows.
const MaxAttemptsShown = 50

func eventViewOf(e Event) eventView {
	v := eventView{Time: e.Time.UTC().Format("2006-01-02 15:04:05.000Z"), Type: e.Type, Key: e.Key,
		Link: runLink(kindOf(e.Key), e.Key), Replica: e.Replica, Class: eventClass(e.Type)}
	v.Owner, _ = e.Data["owner"].(string)
	v.Trigger, _ = e.Data["trigger"].(string)
	if f, ok := e.Data["fence"].(float64); ok {
		v.Fence = int64(f)
	}
	v.Detail = eventDetail(e.Data)
	return v
}

// eventDetail is an event's data beyond the named columns, k=v sorted.
func eventDetail(data map[string]any) string {
	skip := map[string]bool{"key": true, "job": true, "replica": true, "owner": true, "fence": true, "trigger": true}
	keys := make([]string, 0, len(data))
	for k := range data {
		if !skip[k] {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		val := data[k]
		if val == nil || val == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		switch x := val.(type) {
		case string:
			b.WriteString(k + "=" + x)
		case float64:
			b.WriteString(k + "=" + strconv.FormatFloat(x, 'f', -1, 64))
		default:
			j, _ := json.Marshal(x)
			b.WriteString(k + "=" + string(j))
		}
	}
	return b.String()
}

func eventClass(t string) string {
	switch t {
	case "ownership.unavailable", "ownership.lost", "run.failed", "trigger.rejected", "billrun.invoice_conflict":
		return "bad"
	case "run.completed", "ownership.acquired":
		return "good"
	}
	return ""
}

// ------------------------------------------------------------------ events

type eventsView struct {
	Key    string
	Events []eventView
}

func (c *Console) eventsPage(w http.ResponseWriter, r *http.Request, s Session) {
	p := c.page("Events", s, nil)
	p.Nav = "events"
	v := eventsView{Key: strings.TrimSpace(r.URL.Query().Get("key"))}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	evs, err := c.deps.Store.RecentEvents(ctx, v.Key, 100)
	if err != nil {
		p.Problems = append(p.Problems, "events: "+err.Error())
	}
	for _, e := range evs {
		v.Events = append(v.Events, eventViewOf(e))
	}
	p.Data = v
	c.pages.render(w, http.StatusOK, "events", p)
}

// ----------------------------------------------------------------- trigger

package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/events"
)

// timeline reads the ownership events back from the events topic (as any
// consumer of the contract would), prints one line per event and keeps the
// tallies the summary and the end condition need.
type timeline struct {
	out   io.Writer
	start time.Time
	key   string // the bill run's lock key

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every event
	all     []events.CloudEvent
	muted   bool // recording only: the demo is past its timeline
}

// mute stops printing; events are still recorded for the summary.
func (tl *timeline) mute() {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.muted = true
}

func newTimeline(out io.Writer, start time.Time, billKey string) *timeline {
	return &timeline{out: out, start: start, key: billKey, changed: make(chan struct{})}
}

// run consumes topic from its start until ctx ends.
func (tl *timeline) run(ctx context.Context, brokers []string, topic string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond),
		kgo.ClientID("coordinator-demo-timeline"))
	if err != nil {
		return err
	}
	defer cl.Close()
	for ctx.Err() == nil {
		fetches := cl.PollFetches(ctx)
		fetches.EachRecord(func(r *kgo.Record) {
			var ce events.CloudEvent
			if err := json.Unmarshal(r.Value, &ce); err != nil {
				fmt.Fprintf(tl.out, "  (undecodable event at offset %d: %v)\n", r.Offset, err)
				return
			}
			tl.add(ce)
		})
	}
	return nil
}

func (tl *timeline) add(ce events.CloudEvent) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.all = append(tl.all, ce)
	close(tl.changed)
	tl.changed = make(chan struct{})
	if !tl.muted {
		fmt.Fprintln(tl.out, tl.format(ce))
	}
}

// snapshot returns the events so far and a channel closed on the next one.
func (tl *timeline) snapshot() ([]events.CloudEvent, <-chan struct{}) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return append([]events.CloudEvent(nil), tl.all...), tl.changed
}

func str(ce events.CloudEvent, k string) string {
	if v, ok := ce.Data[k]; ok && v != nil {
		return fmt.Sprint(v)
	}
	return ""
}

func num(ce events.CloudEvent, k string) int64 {
	if f, ok := ce.Data[k].(float64); ok {
		return int64(f)
	}
	return 0
}

// shown are the count fields a timeline line prints, in this order.
var shown = []string{"subscribers", "invoices_created", "already_invoiced", "batches_committed", "batches_skipped",
	"period_invoices_created", "freed", "batches"}

func (tl *timeline) format(ce events.CloudEvent) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  %+8.3fs  %-14s %-26s %-20s via %-5s", ce.Time.Sub(tl.start).Seconds(), str(ce, "replica"),
		ce.Type, ce.Subject, str(ce, "trigger"))
	switch ce.Type {
	case events.OwnershipAlreadyOwned:
		owner := str(ce, "owner")
		if owner == "" {
			owner = "(unknown)"
		}
		fmt.Fprintf(&b, " owner=%s", owner)
		if owner == str(ce, "replica") {
			b.WriteString(" (its own run, started by another trigger)")
		}
	case events.RunAlreadyCompleted:
		fmt.Fprintf(&b, " done by %s", str(ce, "owner"))
	}
	if f := num(ce, "fence"); f != 0 {
		fmt.Fprintf(&b, " fence=%d", f)
	}
	for _, k := range shown {
		if n := num(ce, k); n != 0 {
			fmt.Fprintf(&b, " %s=%d", k, n)
		}
	}
	if e := str(ce, "error"); e != "" {
		fmt.Fprintf(&b, " error=%q", e)
	}
	if r := str(ce, "reason"); r != "" && ce.Type != events.OwnershipAlreadyOwned {
		fmt.Fprintf(&b, " reason=%s", r)
	}
	return b.String()
}

// answered reports whether an event ends a bill-run trigger's handling.
func answered(t events.Type) bool {
	switch t {
	case events.RunCompleted, events.RunAlreadyCompleted, events.OwnershipAlreadyOwned,
		events.OwnershipUnavailable, events.RunFailed, events.OwnershipLost:
		return true
	}
	return false
}

// tally summarises the events of one replica.
type tally struct {
	acquired, alreadyOwned, alreadyCompleted, completed, released, failed, lost, unavailable int
	freed                                                                                    int64
	sweepsOwned                                                                              int
}

type summary struct {
	replicas        map[string]*tally
	billAnswered    map[string]int // by trigger source
	billCompleted   []events.CloudEvent
	billReleased    bool
	alreadyOwnedBad int // already_owned events that name no owner
	freed           int64
}

func summarise(all []events.CloudEvent, billKey string) summary {
	s := summary{replicas: map[string]*tally{}, billAnswered: map[string]int{}}
	for _, ce := range all {
		r := str(ce, "replica")
		t := s.replicas[r]
		if t == nil {
			t = &tally{}
			s.replicas[r] = t
		}
		if ce.Subject == billKey {
			if answered(ce.Type) {
				s.billAnswered[str(ce, "trigger")]++
			}
			switch ce.Type {
			case events.OwnershipAcquired:
				t.acquired++
			case events.OwnershipAlreadyOwned:
				t.alreadyOwned++
				if str(ce, "owner") == "" {
					s.alreadyOwnedBad++
				}
			case events.RunAlreadyCompleted:
				t.alreadyCompleted++
			case events.RunCompleted:
				t.completed++
				s.billCompleted = append(s.billCompleted, ce)
			case events.OwnershipReleased:
				t.released++
				s.billReleased = true
			case events.RunFailed:
				t.failed++
			case events.OwnershipLost:
				t.lost++
			case events.OwnershipUnavailable:
				t.unavailable++
			}
			continue
		}
		if str(ce, "job") == "msisdn-reaper" {
			switch ce.Type {
			case events.OwnershipAcquired:
				t.sweepsOwned++
			case events.RunCompleted:
				t.freed += num(ce, "freed")
				s.freed += num(ce, "freed")
			}
		}
	}
	return s
}

func (s summary) answeredTotal() int {
	n := 0
	for _, v := range s.billAnswered {
		n += v
	}
	return n
}

func (s summary) print(w io.Writer) {
	ids := make([]string, 0, len(s.replicas))
	for id := range s.replicas {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	fmt.Fprintf(w, "  %-14s | %8s %13s %17s %9s %8s %6s | %12s %8s\n", "replica", "acquired", "already_owned",
		"already_completed", "completed", "released", "failed", "sweeps owned", "freed")
	for _, id := range ids {
		t := s.replicas[id]
		fmt.Fprintf(w, "  %-14s | %8d %13d %17d %9d %8d %6d | %12d %8d\n", id, t.acquired, t.alreadyOwned,
			t.alreadyCompleted, t.completed, t.released, t.failed+t.lost+t.unavailable, t.sweepsOwned, t.freed)
	}
}

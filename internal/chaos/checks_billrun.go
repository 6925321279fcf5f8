package chaos

// Checks of bill runs and their events: exact invoices, completion of every
// accepted trigger, batch fences, and events agreeing with PostgreSQL.

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// ---------------------------------------------------------------- invoices

func checkInvoices(h *History) []Anomaly {
	var out []Anomaly
	for _, s := range h.Invoices {
		br, _ := h.billRun(s.Period)
		sample := ""
		if len(s.Sample) > 0 {
			sample = fmt.Sprintf(" (subscribers e.g. %v)", s.Sample)
		}
		if br.Status == "COMPLETED" && s.Missing > 0 {
			out = append(out, Anomaly{KindInvoiceMissing, fmt.Sprintf(
				"period %s is COMPLETED (owner %s, claim fence %d) but %d of %d billable subscribers have no invoice%s%s; faults during its run: %s",
				s.Period, br.Owner, br.Fence, s.Missing, s.Expected, sample, h.completionClaim(s.Period, br.EventID), h.faultsDuringRun(s.Period, 4))})
		}
		if s.Duplicates > 0 {
			out = append(out, Anomaly{KindInvoiceDuplicate, fmt.Sprintf(
				"period %s: %d subscribers have more than one invoice%s", s.Period, s.Duplicates, sample)})
		}
		if s.WrongAmount > 0 {
			out = append(out, Anomaly{KindInvoiceWrongAmount, fmt.Sprintf(
				"period %s: %d invoices are not monthly fee + the period's usage%s", s.Period, s.WrongAmount, sample)})
		}
		if s.Unexpected > 0 {
			out = append(out, Anomaly{KindInvoiceUnexpected, fmt.Sprintf(
				"period %s: %d invoices for subscribers that are not billable%s", s.Period, s.Unexpected, sample)})
		}
	}
	return out
}

// completionClaim is what the period's run.completed (the one bill_runs
// stored) said about its invoices.
func (h *History) completionClaim(period, id string) string {
	for _, e := range h.Events {
		if e.Type == "run.completed" && e.Subject == "billrun:"+period && (id == "" || e.ID == id) && e.HasPeriodInvoices {
			return fmt.Sprintf("; its run.completed (%s) said period_invoices_created=%d, repaired=%d", e.Replica, e.PeriodInvoices, e.Repaired)
		}
	}
	return ""
}

// faultsDuringRun names the faults that overlapped the period's run: from
// its first logged claim to its last change (bill_runs' change log, commit
// times).
func (h *History) faultsDuringRun(period string, max int) string {
	var from, to time.Time
	for _, c := range h.BillRunLog {
		if c.Period != period || c.CommittedAt.Year() <= 1970 {
			continue
		}
		if from.IsZero() || c.CommittedAt.Before(from) {
			from = c.CommittedAt
		}
		if c.CommittedAt.After(to) {
			to = c.CommittedAt
		}
	}
	if from.IsZero() || h.WallStart.IsZero() {
		return "unknown (no change of its bill_runs row survived)"
	}
	mono := func(t time.Time) int64 { return h.StartNS + t.Sub(h.WallStart).Nanoseconds() }
	var names []string
	for _, f := range h.Faults {
		if f.StartNS <= mono(to) && f.EndNS >= mono(from) && !f.Skipped {
			names = append(names, fmt.Sprintf("%s@%s on %s", f.Spec.Kind, h.rel(f.StartNS), f.Target))
		}
	}
	if len(names) == 0 {
		return "none"
	}
	if len(names) > max {
		names = append(names[:max], fmt.Sprintf("and %d more", len(names)-max))
	}
	return strings.Join(names, "; ")
}

// -------------------------------------------------------------- completion

// acceptedPeriods maps each period with an accepted trigger (or a cron tick)
// to a description of those triggers and the instant of the first.
func (h *History) acceptedPeriods() (map[string][]string, map[string]int64) {
	why := map[string][]string{}
	first := map[string]int64{}
	note := func(p string, at int64, s string) {
		why[p] = append(why[p], s)
		if f, ok := first[p]; !ok || at < f {
			first[p] = at
		}
	}
	for _, t := range h.Triggers {
		if !t.Accepted {
			continue
		}
		s := t.Source + "@" + h.rel(t.AtNS)
		if t.Source == "http" {
			s = fmt.Sprintf("http %d@%s (%s)", t.Status, h.rel(t.AtNS), t.Replica)
		}
		if t.Note != "" {
			s += " [" + t.Note + "]"
		}
		note(t.Period, t.AtNS, s)
	}
	for _, c := range h.CronTicks {
		note(c.Period, c.AtNS, "cron@"+h.rel(c.AtNS))
	}
	return why, first
}

func checkCompletion(h *History) []Anomaly {
	why, first := h.acceptedPeriods()
	periods := make([]string, 0, len(why))
	for p := range why {
		periods = append(periods, p)
	}
	sort.Strings(periods)
	bound := time.Duration(h.CheckNS - h.FaultsEndNS).Round(100 * time.Millisecond)
	var out []Anomaly
	for _, p := range periods {
		br, ok := h.billRun(p)
		if ok && br.Status == "COMPLETED" {
			continue
		}
		trig := why[p]
		if len(trig) > 6 {
			trig = append(trig[:6], fmt.Sprintf("and %d more", len(trig)-6))
		}
		state := "has no bill_runs row"
		if ok {
			state = fmt.Sprintf("is %s (owner %s, claim fence %d, attempts %d", br.Status, br.Owner, br.Fence, br.Attempts)
			if br.LastError != "" {
				state += fmt.Sprintf(", last_error %q", truncate(br.LastError, 200))
			}
			state += ")"
		}
		out = append(out, Anomaly{KindRunNotCompleted, fmt.Sprintf(
			"billrun:%s %s %s after the faults stopped; accepted triggers: %s; faults since its first trigger: %s",
			p, state, bound, strings.Join(trig, ", "), h.faultsBetween(first[p], h.FaultsEndNS, 4))})
	}
	return out
}

// ------------------------------------------------------------------ fences

// checkBatchFences finds bill-run batches that committed under a claim
// fence lower than one that had already taken effect for the period: a
// newer claim (bill_runs' fence moved on, seen in the change log) or a
// batch committed under a higher fence. Either way a stale owner wrote
// after a newer owner took over: the Postgres fence check did not hold.
func checkBatchFences(h *History) []Anomaly {
	type newer struct {
		at    time.Time
		fence int64
		what  string
	}
	byPeriod := map[string][]newer{}
	for _, c := range h.BillRunLog {
		if !c.CommittedAt.IsZero() && c.CommittedAt.Year() > 1970 {
			byPeriod[c.Period] = append(byPeriod[c.Period], newer{c.CommittedAt, c.Fence,
				fmt.Sprintf("the claim of fence %d by %s (%s)", c.Fence, c.Owner, c.Status)})
		}
	}
	batches := map[string][]BatchRow{}
	for _, b := range h.Batches {
		batches[b.Period] = append(batches[b.Period], b)
		byPeriod[b.Period] = append(byPeriod[b.Period], newer{b.CommittedAt, b.Fence,
			fmt.Sprintf("batch [%d,%d] by %s under fence %d", b.FirstID, b.LastID, b.Owner, b.Fence)})
	}
	var out []Anomaly
	for _, p := range sortedKeys(batches) {
		marks := byPeriod[p]
		slices.SortStableFunc(marks, func(a, b newer) int { return a.at.Compare(b.at) })
		bs := batches[p]
		slices.SortStableFunc(bs, func(a, b BatchRow) int { return a.CommittedAt.Compare(b.CommittedAt) })
		n := 0
		var first BatchRow
		var firstTop newer
		i := 0
		var top newer
		for _, b := range bs {
			for i < len(marks) && marks[i].at.Before(b.CommittedAt) {
				if marks[i].fence > top.fence {
					top = marks[i]
				}
				i++
			}
			if b.Fence < top.fence {
				if n == 0 {
					first, firstTop = b, top
				}
				n++
			}
		}
		if n > 0 {
			out = append(out, Anomaly{KindStaleBatchCommit, fmt.Sprintf(
				"billrun:%s: %d batch(es) committed under a superseded claim fence; first: batch [%d,%d] by %s under fence %d committed at %s, %s after %s had committed",
				p, n, first.FirstID, first.LastID, first.Owner, first.Fence, first.CommittedAt.Format("15:04:05.000"),
				first.CommittedAt.Sub(firstTop.at).Round(time.Millisecond), firstTop.what)})
		}
	}
	return out
}

// ------------------------------------------------------------------ events

func checkEvents(h *History) []Anomaly {
	var out []Anomaly
	// One completion per event id: a re-publication of a run.completed
	// (the owner died before Kafka acknowledged it) repeats its id, and
	// consumers drop the copy. Two ids for one period are two completions.
	completed := map[string][]Event{}
	seen := map[string]bool{}
	lost := h.completionsLostWithCommits()
	for i, e := range h.Events {
		if e.Type != "run.completed" || !strings.HasPrefix(e.Subject, "billrun:") || lost[e.ID] {
			continue
		}
		id := e.ID
		if id == "" { // no id recorded: every event counts
			id = fmt.Sprintf("#%d", i)
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		p := strings.TrimPrefix(e.Subject, "billrun:")
		completed[p] = append(completed[p], e)
	}
	for _, br := range h.BillRuns {
		evs := completed[br.Period]
		switch {
		case br.Status == "COMPLETED" && len(evs) == 0:
			d := fmt.Sprintf("billrun:%s is COMPLETED in bill_runs (owner %s, fence %d) but no run.completed event was published", br.Period, br.Owner, br.Fence)
			if r, ok := h.replica(br.Owner); ok && r.KilledByVerifier {
				d += fmt.Sprintf("; its owner %s was SIGKILLed at %s, so the event was probably still in its in-memory buffer, and no resumer re-published it (bill_runs.completed_event_at) before the check", r.ID, h.rel(r.ExitNS))
			}
			out = append(out, Anomaly{KindEventsRunCompleted, d})
		case br.Status == "COMPLETED" && br.EventID != "" && evs[0].ID != br.EventID:
			out = append(out, Anomaly{KindEventsRunCompleted, fmt.Sprintf(
				"billrun:%s's run.completed has id %s (%s), but bill_runs stored %s: a re-publication would not be recognised as the same event",
				br.Period, evs[0].ID, evs[0].Replica, br.EventID)})
		case br.Status == "COMPLETED" && len(evs) > 1:
			var who []string
			for _, e := range evs {
				who = append(who, fmt.Sprintf("%s fence %d at %s (id %s)", e.Replica, e.Fence, h.relWall(e.Time), e.ID))
			}
			out = append(out, Anomaly{KindEventsRunCompleted, fmt.Sprintf(
				"billrun:%s has %d run.completed events with different ids (%s); a period completes once", br.Period, len(evs), strings.Join(who, "; "))})
		case br.Status != "COMPLETED" && len(evs) > 0:
			out = append(out, Anomaly{KindEventsRunCompleted, fmt.Sprintf(
				"billrun:%s has a run.completed event (%s, fence %d) but bill_runs says %s", br.Period, evs[0].Replica, evs[0].Fence, br.Status)})
		}
	}
	for p, evs := range completed {
		if _, ok := h.billRun(p); !ok {
			out = append(out, Anomaly{KindEventsRunCompleted, fmt.Sprintf("billrun:%s has a run.completed event (%s) but no bill_runs row", p, evs[0].Replica)})
		}
	}

	type term struct {
		replica, key string
		fence        int64
	}
	ended := map[term]bool{}
	for _, e := range h.Events {
		if e.Type == "ownership.released" || e.Type == "ownership.lost" {
			ended[term{e.Replica, e.Subject, e.lockFence()}] = true
		}
	}
	for _, e := range h.Events {
		if e.Type != "ownership.acquired" || ended[term{e.Replica, e.Subject, e.lockFence()}] {
			continue
		}
		r, ok := h.replica(e.Replica)
		if ok && (r.KilledByVerifier || (!r.StoppedByVerifier && r.ExitNS > 0)) {
			continue // a crash ends the term
		}
		d := fmt.Sprintf("%s acquired %s (lock fence %d, trigger %s, request %s) at %s and published neither ownership.released nor ownership.lost, and it did not crash",
			e.Replica, e.Subject, e.lockFence(), e.Trigger, e.RequestID, h.relWall(e.Time))
		if f := h.faultsNearWall(e.Time, 10*time.Second); f != "" {
			d += "; faults within 10s after: " + f
		}
		out = append(out, Anomaly{KindEventsUnended, d})
	}
	return out
}

// completionsLostWithCommits are the ids of run.completed events whose
// COMPLETED update PostgreSQL lost: published during a postgres-lost-commits
// fault's asynchronous window (or within a second after its crash), with an
// id no surviving bill_runs change stored. The product published them after
// PostgreSQL acknowledged the commit; the run was then resumed and completed
// again under a new id. Not the product's doing: excused, and counted.
func (h *History) completionsLostWithCommits() map[string]bool {
	type window struct{ from, to time.Time }
	var ws []window
	for _, f := range h.Faults {
		if f.Spec.Kind == FaultPGLostCommits && f.CrashNS > 0 && !h.WallStart.IsZero() {
			ws = append(ws, window{h.WallStart.Add(time.Duration(f.StartNS - h.StartNS)), h.WallStart.Add(time.Duration(f.CrashNS-h.StartNS) + time.Second)})
		}
	}
	if len(ws) == 0 {
		return nil
	}
	stored := map[string]bool{}
	for _, c := range h.BillRunLog {
		stored[c.EventID] = true
	}
	for _, b := range h.BillRuns {
		stored[b.EventID] = true
	}
	out := map[string]bool{}
	for _, e := range h.Events {
		if e.Type != "run.completed" || !strings.HasPrefix(e.Subject, "billrun:") || e.ID == "" || stored[e.ID] {
			continue
		}
		for _, w := range ws {
			if !e.Time.Before(w.from) && !e.Time.After(w.to) {
				out[e.ID] = true
			}
		}
	}
	return out
}

// faultsNearWall names faults that started within d after wall time t.
func (h *History) faultsNearWall(t time.Time, d time.Duration) string {
	if h.WallStart.IsZero() {
		return ""
	}
	at := h.StartNS + t.Sub(h.WallStart).Nanoseconds()
	s := h.faultsBetween(at-int64(time.Second), at+d.Nanoseconds(), 3)
	if s == "none" {
		return ""
	}
	return s
}

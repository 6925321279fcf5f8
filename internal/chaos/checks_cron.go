package chaos

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// KindCronTickDropped: a bill-run cron tick that fired on the replicas
// neither ran nor was recorded for the resumer, and nothing went on trying.
const KindCronTickDropped = "cron_tick_dropped"

// cronAttempt is one replica's handling of one cron tick (one request id):
// from its first log line to its trigger_dispatched (End zero: none was
// logged, the replica died or was stopped first).
type cronAttempt struct {
	Replica   string
	RequestID string
	Start     time.Time
	End       time.Time
	Outcome   string
	Deferred  bool
	CatchUp   time.Time // the tick a catch-up attempt catches up
	// Covering: an earlier tick's attempt still running on a replica that
	// skipped this tick because of it; it answers for this tick too.
	Covering bool
}

func (a cronAttempt) String() string {
	s := a.Replica
	if a.Covering {
		s += " (skipped it: an earlier tick's attempt ran on)"
	}
	if a.End.IsZero() {
		return s + " (no end logged)"
	}
	s += " " + a.Outcome
	if a.Deferred {
		s += " (recorded)"
	}
	return s
}

func (h *History) cronAttempts() []cronAttempt {
	idx := map[string]int{}
	var out []cronAttempt
	for _, l := range h.CronLines {
		if l.RequestID == "" {
			continue
		}
		k := l.Replica + "/" + l.RequestID
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, cronAttempt{Replica: l.Replica, RequestID: l.RequestID, Start: l.Time})
		}
		a := &out[i]
		switch l.Msg {
		case "cron_catchup_tick":
			a.CatchUp = l.Scheduled
		case "trigger_dispatched":
			a.End, a.Outcome, a.Deferred = l.Time, l.Outcome, l.Deferred
		}
	}
	return out
}

// replicaDied: the incarnation ended before the verifier stopped it (killed
// by a fault, or crashed).
func (h *History) replicaDied(id string) bool {
	r, ok := h.replica(id)
	return ok && r.ExitNS > 0 && (r.KilledByVerifier || !r.StoppedByVerifier)
}

// tickVerdict is what became of one tick. A tick is taken care of, by the
// product's own rule (job.Result.Handled) for a bill run, when an attempt
// completed the period or found it completed, or recorded the request for
// the resumer.
type tickVerdict struct {
	tick     CronTick
	attempts []cronAttempt
	// how: ran (an attempt completed it or found it completed), recorded
	// (deferred to the resumer), superseded (every attempt failed, but one
	// went on trying into the second half of the interval, when the next
	// tick takes the same period over), in_flight (an attempt logged no
	// end: its replica died during it), skipped (replicas
	// skipped it for an earlier tick's attempt the verifier did not see),
	// unobserved (no replica logged anything of it), dropped. A replica
	// that skipped the tick answers for it with the earlier tick's attempt
	// it skipped it for: that attempt is one of the tick's.
	how string
}

// cronVerdicts judges every recorded tick from what the replicas logged.
// An attempt belongs to the latest tick at or before its first line
// (a catch-up to the tick it names).
func (h *History) cronVerdicts() []tickVerdict {
	every := h.CronEvery
	if every <= 0 || len(h.CronTicks) == 0 {
		return nil
	}
	ticks := slices.Clone(h.CronTicks)
	slices.SortFunc(ticks, func(a, b CronTick) int { return a.At.Compare(b.At) })
	byTick := make([][]cronAttempt, len(ticks))
	attempts := h.cronAttempts()
	for _, a := range attempts {
		i := -1
		if !a.CatchUp.IsZero() {
			for j, t := range ticks {
				if d := a.CatchUp.Sub(t.At); d > -time.Second && d < time.Second {
					i = j
				}
			}
		} else {
			for j, t := range ticks {
				if !t.At.After(a.Start.Add(500*time.Millisecond)) && a.Start.Sub(t.At) < every {
					i = j
				}
			}
		}
		if i >= 0 {
			byTick[i] = append(byTick[i], a)
		}
	}
	// A replica that skipped a tick because its previous tick still ran
	// answers for it with that attempt: it is one of the tick's attempts.
	skipped := map[int]bool{}
	for _, l := range h.CronLines {
		if l.Msg != "cron_tick_skipped" {
			continue
		}
		for j, t := range ticks {
			if d := l.Scheduled.Sub(t.At); d <= -time.Second || d >= time.Second {
				continue
			}
			skipped[j] = true
			var cover *cronAttempt
			for i, a := range attempts {
				if a.Replica == l.Replica && a.Start.Before(t.At) && (a.End.IsZero() || !a.End.Before(t.At)) &&
					(cover == nil || a.Start.After(cover.Start)) {
					cover = &attempts[i]
				}
			}
			if cover != nil {
				c := *cover
				c.Covering = true
				byTick[j] = append(byTick[j], c)
			}
		}
	}
	out := make([]tickVerdict, len(ticks))
	for i, t := range ticks {
		v := tickVerdict{tick: t, attempts: byTick[i]}
		var lastEnd time.Time
		unfinished := false
		for _, a := range v.attempts {
			switch {
			case a.Outcome == "completed" || a.Outcome == "already_completed":
				v.how = "ran"
			case a.Deferred:
				if v.how == "" {
					v.how = "recorded"
				}
			case a.End.IsZero() && h.replicaDied(a.Replica):
				// Its replica died in it (killed, crashed): the tick's fate
				// there is unknown. One that lived to the end and never
				// ended the attempt hung in it: that answers for nothing.
				unfinished = true
			}
			if a.End.After(lastEnd) {
				lastEnd = a.End
			}
		}
		switch {
		case v.how != "":
		case len(v.attempts) == 0 && skipped[i]:
			v.how = "skipped"
		case len(v.attempts) == 0:
			v.how = "unobserved"
		case unfinished:
			v.how = "in_flight"
		case !lastEnd.Before(t.At.Add(every / 2)):
			v.how = "superseded"
		default:
			v.how = "dropped"
		}
		out[i] = v
	}
	return out
}

// checkCronTicks: every bill-run cron tick that fired during the phase ran
// (completed the period, or found it completed) or was recorded for the
// resumer (run_not_completed then checks that it ran), on at least one
// replica. A tick whose attempts all failed is excused only when one went
// on trying past the middle of the interval (the next tick bills the same
// period) or logged no end (its replica died or was stopped in it).
func checkCronTicks(h *History) []Anomaly {
	var out []Anomaly
	for _, v := range h.cronVerdicts() {
		if v.how != "dropped" {
			continue
		}
		var what []string
		var last time.Time
		for _, a := range v.attempts {
			if a.End.IsZero() {
				what = append(what, a.String()+", hung: its replica lived on")
				continue
			}
			what = append(what, fmt.Sprintf("%s at %s", a, h.relWall(a.End)))
			if a.End.After(last) {
				last = a.End
			}
		}
		when := "no attempt ended"
		if !last.IsZero() {
			when = fmt.Sprintf("the last %s after the tick, %s before the next", last.Sub(v.tick.At).Round(100*time.Millisecond),
				v.tick.At.Add(h.CronEvery).Sub(last).Round(100*time.Millisecond))
		}
		out = append(out, Anomaly{KindCronTickDropped, fmt.Sprintf(
			"the bill-run cron tick at %s (bills %s; fired on %s) was neither run nor recorded: every attempt ended without it (%s), %s; nothing retried it",
			h.relWall(v.tick.At), v.tick.Period, strings.Join(v.tick.Live, ", "), strings.Join(what, "; "), when)})
	}
	return out
}

package chaos

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Anomaly is one property violation found in a history (report.json's
// "anomalies").
type Anomaly struct {
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
}

// Anomaly kinds. kindDocs (report.go) explains each in report.md.
const (
	KindInvoiceMissing       = "invoice_missing"
	KindInvoiceDuplicate     = "invoice_duplicate"
	KindInvoiceWrongAmount   = "invoice_wrong_amount"
	KindInvoiceUnexpected    = "invoice_unexpected"
	KindRunNotCompleted      = "run_not_completed"
	KindStaleBatchCommit     = "stale_batch_commit"
	KindStaleWrite           = "stale_write"
	KindFenceNotIncreasing   = "fence_not_increasing"
	KindMutualExclusion      = "mutual_exclusion"
	KindHolderOutlived       = "holder_outlived"
	KindProcessStillRunning  = "process_still_running"
	KindEventsRunCompleted   = "events_run_completed"
	KindEventsUnended        = "events_unended_acquisition"
	KindPoisonNotDeadLetter  = "poison_not_dead_lettered"
	KindStaleReservationLeft = "stale_reservation_left"
	KindLiveReservationFreed = "live_reservation_freed"
	KindReplicaExited        = "replica_exited"
	KindReplicaShutdownHung  = "replica_shutdown_hung"
	KindLockUsageError       = "lock_usage_error"
)

// checker is one property over a history.
type checker struct {
	name string
	fn   func(*History) []Anomaly
}

var checkers = []checker{
	{"invoices", checkInvoices},
	{"completion", checkCompletion},
	{"batch fences", checkBatchFences},
	{"write fences", checkWrites},
	{"fence order", checkFenceOrder},
	{"mutual exclusion", checkMutualExclusion},
	{"process trees", checkTrees},
	{"events vs postgres", checkEvents},
	{"dead letters", checkPoison},
	{"msisdn pool", checkPool},
	{"replicas", checkReplicas},
	{"lock runs", checkLockRuns},
	{"cron ticks", checkCronTicks},
	{"fenced store", checkFencedWrites},
	{"in-process fence order", checkInprocFences},
}

// Check runs every checker over h.
func Check(h *History) []Anomaly {
	var out []Anomaly
	for _, c := range checkers {
		out = append(out, c.fn(h)...)
	}
	return out
}

// rel formats a monotonic instant as +seconds from the start of the fault phase.
func (h *History) rel(ns int64) string {
	if ns == 0 {
		return "?"
	}
	return fmt.Sprintf("+%.1fs", float64(ns-h.StartNS)/1e9)
}

// relWall formats a wall-clock time the same way (events).
func (h *History) relWall(t time.Time) string {
	if h.WallStart.IsZero() || t.IsZero() {
		return t.Format("15:04:05.000")
	}
	return fmt.Sprintf("+%.1fs", t.Sub(h.WallStart).Seconds())
}

func (h *History) billRun(period string) (BillRunRow, bool) {
	for _, b := range h.BillRuns {
		if b.Period == period {
			return b, true
		}
	}
	return BillRunRow{}, false
}

func (h *History) replica(id string) (ReplicaRun, bool) {
	for _, r := range h.Replicas {
		if r.ID == id {
			return r, true
		}
	}
	return ReplicaRun{}, false
}

// faultsBetween names the faults that started in [from, to].
func (h *History) faultsBetween(from, to int64, max int) string {
	var names []string
	for _, f := range h.Faults {
		if f.StartNS >= from && f.StartNS <= to {
			n := f.Spec.Kind + "@" + h.rel(f.StartNS)
			if f.Target != "" {
				n += " on " + f.Target
			}
			names = append(names, n)
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

// checkWrites finds fenced rows committed below the highest fence already
// committed for their key. Two causes are told apart: a stale writer (a
// holder or a process it left behind, writing after a newer holder did),
// reported one by one; and fences that went backwards (the writer started
// after the holder of the higher fence had finished, so it should have got
// a higher token), reported once per episode with its extent.
func checkWrites(h *History) []Anomaly {
	type holder struct {
		pid   int
		start uint64
	}
	sections := map[holder]Section{}
	for _, s := range h.Sections {
		sections[holder{s.LockPID, s.LockStart}] = s
	}
	byKey := map[string][]Write{}
	for _, w := range h.Writes {
		byKey[w.Key] = append(byKey[w.Key], w)
	}
	var out []Anomaly
	for _, k := range sortedKeys(byKey) {
		ws := byKey[k]
		slices.SortFunc(ws, func(a, b Write) int { return cmp.Compare(a.ID, b.ID) })
		type episode struct {
			top     Write
			first   Write
			writes  int
			holders map[holder]bool
			lo, hi  int64
		}
		var episodes []*episode
		byTop := map[int64]*episode{}
		type writerKey struct {
			pid int
			h   holder
		}
		seen := map[writerKey]bool{}
		var top Write
		for i, w := range ws {
			if i > 0 && w.Fence < top.Fence {
				topSec, okT := sections[holder{top.LockPID, top.LockStart}]
				wSec, okW := sections[holder{w.LockPID, w.LockStart}]
				regression := w.Role == "section" && okT && okW && topSec.EndNS > 0 && topSec.EndNS <= wSec.StartNS
				switch {
				case w.Role == "section" && okW && okT && h.excuse(wSec, topSec) != "":
					// excused: a fenced store refuses it (see excuse)
				case regression:
					e := byTop[top.ID]
					if e == nil {
						e = &episode{top: top, first: w, holders: map[holder]bool{}, lo: w.Fence, hi: w.Fence}
						byTop[top.ID] = e
						episodes = append(episodes, e)
					}
					e.writes++
					e.holders[holder{w.LockPID, w.LockStart}] = true
					e.lo, e.hi = min(e.lo, w.Fence), max(e.hi, w.Fence)
				case !seen[writerKey{w.PID, holder{w.LockPID, w.LockStart}}]:
					seen[writerKey{w.PID, holder{w.LockPID, w.LockStart}}] = true
					who := "a holder"
					if w.Role != "section" {
						who = "a process left running by a holder"
					}
					out = append(out, Anomaly{KindStaleWrite, fmt.Sprintf(
						"key %s: %s (pid %d, holder lock pid %d) committed write #%d with fence %d at %s, after write #%d with fence %d (pid %d, holder lock pid %d) at %s",
						k, who, w.PID, w.LockPID, w.ID, w.Fence, h.rel(w.MonoNS), top.ID, top.Fence, top.PID, top.LockPID, h.rel(top.MonoNS))})
				}
			}
			if i == 0 || w.Fence > top.Fence {
				top = w
			}
		}
		for _, e := range episodes {
			out = append(out, Anomaly{KindStaleWrite, fmt.Sprintf(
				"key %s: fences went backwards: from %s, %d writes by %d later holders carried fences %d..%d, below fence %d committed at %s by a holder that had already finished; a store that fences on the highest token seen would have rejected every one",
				k, h.rel(e.first.MonoNS), e.writes, len(e.holders), e.lo, e.hi, e.top.Fence, h.rel(e.top.MonoNS))})
		}
	}
	return out
}

func checkFenceOrder(h *History) []Anomaly {
	var out []Anomaly
	// Lock workers: acquisitions in the order their commands started.
	byKey := map[string][]Section{}
	for _, s := range h.Sections {
		byKey[s.Key] = append(byKey[s.Key], s)
	}
	for _, k := range sortedKeys(byKey) {
		ss := byKey[k]
		slices.SortFunc(ss, func(a, b Section) int { return cmp.Compare(a.StartNS, b.StartNS) })
		for i := 1; i < len(ss); i++ {
			prev, s := ss[i-1], ss[i]
			if s.Fence <= prev.Fence {
				out = append(out, Anomaly{KindFenceNotIncreasing, fmt.Sprintf(
					"key %s: the holder that started at %s (lock pid %d, owner %s) got fence %d, not above fence %d of the holder before it (lock pid %d, started %s)",
					k, h.rel(s.StartNS), s.LockPID, s.Owner, s.Fence, prev.Fence, prev.LockPID, h.rel(prev.StartNS))})
			}
		}
	}
	// Replicas: ownership.acquired in event-time order, per lock key.
	acq := map[string][]Event{}
	for _, e := range h.Events {
		if e.Type == "ownership.acquired" {
			acq[e.Subject] = append(acq[e.Subject], e)
		}
	}
	for _, k := range sortedKeys(acq) {
		es := acq[k]
		slices.SortStableFunc(es, func(a, b Event) int { return a.Time.Compare(b.Time) })
		for i := 1; i < len(es); i++ {
			prev, e := es[i-1], es[i]
			if e.lockFence() <= prev.lockFence() {
				out = append(out, Anomaly{KindFenceNotIncreasing, fmt.Sprintf(
					"%s: %s acquired at %s with lock fence %d, not above lock fence %d of %s's acquisition at %s",
					k, e.Replica, h.relWall(e.Time), e.lockFence(), prev.lockFence(), prev.Replica, h.relWall(prev.Time))})
			}
		}
	}
	return out
}

// -------------------------------------------------------- mutual exclusion

// overlap is two holders of one key inside their sections at once.
type overlap struct {
	a, b Section // a started first
	// excused says why it is not the product's fault ("" if it is).
	excused string
}

// pausedDuring returns the verifier's stop of s's `coordinator lock` that
// fell inside s, if any.
func (h *History) pausedDuring(s Section) (LockRun, bool) {
	for _, l := range h.LockRuns {
		if l.PID == s.LockPID && l.StartTime == s.LockStart && l.Paused && l.PausedNS > 0 &&
			(s.EndNS == 0 || l.PausedNS <= s.EndNS) {
			return l, true
		}
	}
	return LockRun{}, false
}

// excuse says why a stale holder acting beside a newer one is not the
// product's fault, or "" if it is. Two cases, both only when the stale
// holder's fence is below the newer one's, i.e. when a store fencing on the
// token refuses the stale side (which is what the lock documents as the
// protection; docs/lock.md, "What it does not promise"):
//   - the verifier had the stale holder's `coordinator lock` stopped: no
//     process can end its command in time while it is stopped;
//   - the lock was lost with Redis: a master restart without persistence or
//     a failover started between the stale holder's start and the newer
//     holder's (asynchronous replication is not consensus).
//
// A newer holder with an equal or lower fence is never excused.
func (h *History) excuse(stale Section, newer Section) string {
	if stale.Fence >= newer.Fence {
		return ""
	}
	if l, ok := h.pausedDuring(stale); ok {
		return fmt.Sprintf("its coordinator lock (pid %d) was SIGSTOPped by the verifier at %s; fence %d < %d, so a fenced store refuses it",
			l.PID, h.rel(l.PausedNS), stale.Fence, newer.Fence)
	}
	for _, f := range h.Faults {
		if (f.Spec.Kind == FaultRedisRestart || f.Spec.Kind == FaultRedisFailover) && !f.Skipped &&
			f.StartNS >= stale.StartNS-int64(time.Second) && f.StartNS <= newer.StartNS {
			return fmt.Sprintf("the lock was lost with Redis (%s at %s); fence %d < %d, so a fenced store refuses it",
				f.Spec.Kind, h.rel(f.StartNS), stale.Fence, newer.Fence)
		}
	}
	return ""
}

func (h *History) overlaps() []overlap {
	byKey := map[string][]Section{}
	for _, s := range h.Sections {
		if s.EndNS > 0 {
			byKey[s.Key] = append(byKey[s.Key], s)
		}
	}
	var out []overlap
	for _, k := range sortedKeys(byKey) {
		ss := byKey[k]
		slices.SortFunc(ss, func(a, b Section) int { return cmp.Compare(a.StartNS, b.StartNS) })
		var open []Section // sections whose end is after the current start
		for _, s := range ss {
			kept := open[:0]
			for _, o := range open {
				if o.EndNS > s.StartNS {
					kept = append(kept, o)
				}
			}
			open = kept
			for _, o := range open {
				if o.LockPID == s.LockPID && o.LockStart == s.LockStart {
					continue
				}
				ov := overlap{a: o, b: s}
				if ov.excused = h.excuse(o, s); ov.excused == "" {
					ov.excused = h.excuse(s, o)
				}
				out = append(out, ov)
			}
			open = append(open, s)
		}
	}
	return out
}

// excusedOverlaps lists the overlaps excused, for the report.
func (h *History) excusedOverlaps() []string {
	var out []string
	for _, ov := range h.overlaps() {
		if ov.excused != "" {
			out = append(out, fmt.Sprintf("key %s: lock pid %d (fence %d) %s..%s and lock pid %d (fence %d) %s..%s: %s",
				ov.a.Key, ov.a.LockPID, ov.a.Fence, h.rel(ov.a.StartNS), h.rel(ov.a.EndNS),
				ov.b.LockPID, ov.b.Fence, h.rel(ov.b.StartNS), h.rel(ov.b.EndNS), ov.excused))
		}
	}
	return out
}

func checkMutualExclusion(h *History) []Anomaly {
	var out []Anomaly
	for _, ov := range h.overlaps() {
		if ov.excused != "" {
			continue
		}
		o, s := ov.a, ov.b
		d := time.Duration(min(o.EndNS, s.EndNS) - s.StartNS)
		out = append(out, Anomaly{KindMutualExclusion, fmt.Sprintf(
			"key %s: two holders inside the lock at once for %s: lock pid %d (owner %s, fence %d) held %s..%s and lock pid %d (owner %s, fence %d) held %s..%s",
			o.Key, d.Round(time.Millisecond), o.LockPID, o.Owner, o.Fence, h.rel(o.StartNS), h.rel(o.EndNS),
			s.LockPID, s.Owner, s.Fence, h.rel(s.StartNS), h.rel(s.EndNS))})
	}
	return out
}

// ----------------------------------------------------------- process trees

type holderKey struct {
	pid   int
	start uint64
}

func checkTrees(h *History) []Anomaly {
	holders := map[holderKey]LockRun{}
	for _, l := range h.LockRuns {
		holders[holderKey{l.PID, l.StartTime}] = l
	}
	var out []Anomaly
	for _, s := range h.StillRunning {
		out = append(out, Anomaly{KindProcessStillRunning, fmt.Sprintf(
			"pid %d (%s of key %s, fence %d) was still running %s after its holder, lock pid %d, exited at %s",
			s.PID, s.Role, s.Key, s.Fence, time.Duration(s.SeenNS-s.HolderExitNS).Round(time.Millisecond), s.LockPID, h.rel(s.HolderExitNS))})
	}
	// A process that recorded work after its holder exited outlived it.
	type procKey struct {
		pid   int
		start uint64
	}
	latest := map[procKey]HelperProc{}
	for _, p := range h.Procs {
		latest[procKey{p.PID, p.StartTime}] = p
	}
	// A writer is its PID under its holder (PIDs are reused over a long run).
	type writer struct {
		pid, lockPID int
		lockStart    uint64
	}
	lastWrite := map[writer]Write{}
	for _, w := range h.Writes {
		k := writer{w.PID, w.LockPID, w.LockStart}
		if cur, ok := lastWrite[k]; !ok || w.MonoNS > cur.MonoNS {
			lastWrite[k] = w
		}
	}
	keys := make([]procKey, 0, len(latest))
	for k := range latest {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b procKey) int { return cmp.Compare(a.pid, b.pid) })
	for _, k := range keys {
		p := latest[k]
		l, ok := holders[holderKey{p.LockPID, p.LockStart}]
		if !ok || l.ExitNS == 0 {
			continue
		}
		last := p.EndedNS
		what := "recorded its end"
		if w, ok := lastWrite[writer{p.PID, p.LockPID, p.LockStart}]; ok && w.MonoNS > last {
			last, what = w.MonoNS, fmt.Sprintf("committed write #%d (fence %d)", w.ID, w.Fence)
		}
		if last > l.ExitNS {
			cause := "exited"
			if l.Killed {
				cause = "was SIGKILLed by the verifier and exited"
			}
			out = append(out, Anomaly{KindHolderOutlived, fmt.Sprintf(
				"pid %d (%s of key %s, fence %d) %s at %s, %s after its holder, lock pid %d, %s at %s",
				p.PID, p.Role, p.Key, p.Fence, what, h.rel(last), time.Duration(last-l.ExitNS).Round(time.Millisecond),
				p.LockPID, cause, h.rel(l.ExitNS))})
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

// ------------------------------------------------------- poison, pool, procs

func checkPoison(h *History) []Anomaly {
	var out []Anomaly
	for _, p := range h.Poison {
		if !p.Produced {
			continue
		}
		found := false
		for _, d := range h.DLQ {
			if (d.SourceTopic == p.Topic && d.SourcePartition == p.Partition && d.SourceOffset == p.Offset) ||
				(p.Marker != "" && strings.Contains(d.Prefix, p.Marker)) {
				found = true
				break
			}
		}
		if !found {
			out = append(out, Anomaly{KindPoisonNotDeadLetter, fmt.Sprintf(
				"%s trigger of %d bytes (partition %d, offset %d, produced at %s) never reached the dead-letter topic",
				p.Kind, p.Size, p.Partition, p.Offset, h.rel(p.AtNS))})
		}
	}
	return out
}

func checkPool(h *History) []Anomaly {
	var out []Anomaly
	if h.Pool.StaleLeft > 0 {
		out = append(out, Anomaly{KindStaleReservationLeft, fmt.Sprintf(
			"%d expired MSISDN reservations (of %d seeded) were still RESERVED when the recovery phase ended", h.Pool.StaleLeft, h.Pool.StaleSeen)})
	}
	if h.Pool.LiveLeft < h.Pool.LiveSeeded {
		out = append(out, Anomaly{KindLiveReservationFreed, fmt.Sprintf(
			"%d of %d MSISDN reservations whose hold had not expired were freed", h.Pool.LiveSeeded-h.Pool.LiveLeft, h.Pool.LiveSeeded)})
	}
	return out
}

func checkReplicas(h *History) []Anomaly {
	var out []Anomaly
	for _, r := range h.Replicas {
		switch {
		case r.ReadyNS > 0 && r.ExitNS > 0 && !r.KilledByVerifier && !r.StoppedByVerifier:
			out = append(out, Anomaly{KindReplicaExited, fmt.Sprintf(
				"replica %s (pid %d) exited with code %d at %s without a signal from the verifier; last log lines: %s",
				r.ID, r.PID, r.Exit, h.rel(r.ExitNS), truncate(strings.Join(r.Tail, " | "), 600))})
		case r.ShutdownKilled:
			out = append(out, Anomaly{KindReplicaShutdownHung, fmt.Sprintf(
				"replica %s (pid %d) did not exit within its shutdown bound after SIGTERM and was killed (its goroutines, dumped by SIGQUIT, end its log); last log lines: %s",
				r.ID, r.PID, truncate(strings.Join(r.Tail, " | "), 600))})
		}
	}
	return out
}

func checkLockRuns(h *History) []Anomaly {
	n := 0
	var first LockRun
	for _, l := range h.LockRuns {
		if l.Exit == 64 {
			if n == 0 {
				first = l
			}
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return []Anomaly{{KindLockUsageError, fmt.Sprintf(
		"%d `coordinator lock` runs exited 64 (usage): the verifier's invocation no longer matches the CLI; first (key %s, lease %s): %s",
		n, first.Key, first.Lease, truncate(strings.Join(first.Tail, " | "), 400))}}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

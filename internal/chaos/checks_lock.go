package chaos

// Checks of the lock holders' history: fenced writes and fence order per key,
// mutual exclusion of critical sections, and holders' process trees.

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

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

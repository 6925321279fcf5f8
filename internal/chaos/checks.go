package chaos

import (
	"fmt"
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

package chaos

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// Report is report.json (issue 14's shape; scripts depend on it).
type Report struct {
	Seed       uint64           `json:"seed"`
	DurationS  float64          `json:"duration_s"`
	Faults     map[string]int   `json:"faults"`
	Operations map[string]int64 `json:"operations"`
	Anomalies  []Anomaly        `json:"anomalies"`
	Verdict    string           `json:"verdict"`
}

// Verdicts.
const (
	VerdictOK        = "ok"
	VerdictAnomalies = "anomalies"
)

// maxPerKind bounds the anomalies of one kind listed in the report; the
// rest are counted in one summary entry.
const maxPerKind = 50

func (r *run) report(anomalies []Anomaly) Report {
	h := &r.hist
	rep := Report{Seed: r.cfg.Seed, DurationS: r.cfg.Duration.Seconds(), Faults: map[string]int{}, Operations: operations(h)}
	for _, k := range r.cfg.Faults {
		rep.Faults[k] = 0
	}
	for _, f := range h.Faults {
		if !f.Skipped {
			rep.Faults[f.Spec.Kind]++
		}
	}
	rep.Anomalies = capAnomalies(anomalies)
	rep.Verdict = VerdictOK
	if len(anomalies) > 0 {
		rep.Verdict = VerdictAnomalies
	}
	return rep
}

// capAnomalies keeps the first maxPerKind of each kind, plus one entry
// counting the rest.
func capAnomalies(all []Anomaly) []Anomaly {
	out := []Anomaly{}
	n := map[string]int{}
	for _, a := range all {
		n[a.Kind]++
		if n[a.Kind] <= maxPerKind {
			out = append(out, a)
		}
	}
	for _, k := range sortedKeys(n) {
		if n[k] > maxPerKind {
			out = append(out, Anomaly{Kind: k, Detail: fmt.Sprintf("... and %d more %s anomalies (history.json has the data)", n[k]-maxPerKind, k)})
		}
	}
	return out
}

func operations(h *History) map[string]int64 {
	ops := map[string]int64{}
	for _, e := range h.Events {
		switch {
		case e.Type == "ownership.acquired":
			ops["acquisitions"]++
		case e.Type == "run.completed" && strings.HasPrefix(e.Subject, "msisdn-reaper"):
			ops["reaper_sweeps"]++
		}
	}
	ops["acquisitions"] += int64(len(h.Sections)) // lock workers' acquisitions
	ops["acquisitions"] += int64(len(h.Inproc))   // in-process workers' acquisitions
	ops["inproc_acquisitions"] = int64(len(h.Inproc))
	ops["inproc_acquire_busy"] = h.InprocBusy
	ops["inproc_acquire_unavailable"] = h.InprocUnavailable
	for _, s := range h.Inproc {
		if s.LostNS > 0 {
			ops["inproc_leases_lost"]++
		}
	}
	for _, w := range h.FencedWrites {
		if w.Accepted {
			ops["fenced_store_accepted"]++
		} else {
			ops["fenced_store_refused"]++
		}
	}
	ops["partition_cutoffs"] = int64(len(h.cutOffs()) + len(h.ownerCutOffs()))
	for _, v := range h.cronVerdicts() {
		ops["cron_ticks_"+v.how]++
	}
	for _, f := range h.Faults {
		ops["lost_wal_bytes"] += f.LostWAL
	}
	ops["completions_lost_with_commits"] = int64(len(h.completionsLostWithCommits()))
	// Repairs a completion reported (data.repaired of run.completed, each
	// event id once): subscribers billed by the reconciliation.
	repaired := map[string]bool{}
	for _, e := range h.Events {
		if e.Type == "run.completed" && e.Repaired > 0 && !repaired[e.ID] {
			repaired[e.ID] = true
			ops["runs_repaired"]++
			ops["subscribers_repaired"] += e.Repaired
		}
	}
	ops["events"] = int64(len(h.Events))
	periods := map[string]bool{}
	for _, t := range h.Triggers {
		ops["triggers"]++
		ops["triggers_"+t.Source]++
		if t.Accepted {
			ops["triggers_accepted"]++
		}
		if t.Attempt > 0 {
			ops["triggers_retried"]++
		}
		periods[t.Period] = true
	}
	ops["cron_ticks"] = int64(len(h.CronTicks))
	for _, c := range h.CronTicks {
		periods[c.Period] = true
	}
	ops["periods"] = int64(len(periods))
	for _, b := range h.BillRuns {
		if b.Status == "COMPLETED" {
			ops["periods_completed"]++
		}
	}
	ops["bill_run_batches"] = int64(len(h.Batches))
	for _, s := range h.Invoices {
		ops["invoices"] += s.Invoices
	}
	ops["lock_runs"] = int64(len(h.LockRuns))
	ops["critical_sections"] = int64(len(h.Sections))
	ops["fenced_writes"] = int64(len(h.Writes))
	for _, w := range h.Writes {
		if w.Role == "late" {
			ops["late_writes"]++
		}
	}
	for _, l := range h.LockRuns {
		if l.Exit == 76 {
			ops["lock_runs_lost"]++
		}
	}
	ops["overlaps_excused"] = int64(len(h.excusedOverlaps()))
	ops["poison_records"] = int64(len(h.Poison))
	ops["dlq_records"] = int64(len(h.DLQ))
	ops["replica_starts"] = int64(len(h.Replicas))
	return ops
}

// writeReports writes report.json, report.md, schedule.json (the plan the
// seed gave) and history.json (everything the checks looked at).
func writeReports(dir string, rep Report, h *History, r *run, anomalies []Anomaly) error {
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	all := append(slices.Clone(r.plan), r.netPlan...)
	slices.SortStableFunc(all, func(a, b FaultSpec) int { return cmp.Compare(a.At, b.At) })
	plan, _ := json.MarshalIndent(all, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "schedule.json"), append(plan, '\n'), 0o644); err != nil {
		return err
	}
	hist, _ := json.Marshal(h)
	if err := os.WriteFile(filepath.Join(dir, "history.json"), hist, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.md"), []byte(markdown(rep, h, r, anomalies)), 0o644)
}

// LoadHistory reads the history.json a run wrote into dir, so that the
// checks can be run again over it (`chaos check DIR`), for instance after a
// checker changed.
func LoadHistory(dir string) (*History, error) {
	b, err := os.ReadFile(filepath.Join(dir, "history.json"))
	if err != nil {
		return nil, err
	}
	var h History
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("%s/history.json: %w", dir, err)
	}
	return &h, nil
}

func markdown(rep Report, h *History, r *run, anomalies []Anomaly) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Chaos report\n\n")
	verdict := "**ok**: no anomaly found"
	if rep.Verdict == VerdictAnomalies {
		verdict = fmt.Sprintf("**anomalies**: %d found", len(anomalies))
	}
	w("Verdict: %s.\n\n", verdict)
	sab := "no"
	if r.cfg.Sabotage {
		sab = "**yes** (the chaos_sabotage build: a bill run ignores a lost lease and skips the batch fence check, completes without reconciling, and a failed cron tick is dropped; anomalies are expected)"
	}
	w("| | |\n|---|---|\n")
	w("| seed | %d |\n| fault phase | %s |\n| recovery bound | %s (quiet phase used: %s) |\n| sabotage | %s |\n| coordinator | `%s` |\n| replicas, lock workers | %d, %d on %d keys |\n| subscribers per period | %d |\n\n",
		rep.Seed, r.cfg.Duration, r.cfg.Recovery, time.Duration(h.CheckNS-h.FaultsEndNS).Round(100*time.Millisecond), sab,
		r.cfg.Binaries.Coordinator, r.cfg.Replicas, r.cfg.LockWorkers, r.cfg.LockKeys, r.cfg.Subscribers)
	sabEnv := ""
	if r.cfg.Sabotage {
		sabEnv = "CHAOS_SABOTAGE=1 "
	}
	kinds := ""
	if len(r.cfg.Faults) != len(AllFaults) {
		kinds = "CHAOS_FAULTS=" + strings.Join(r.cfg.Faults, ",") + " "
	}
	w("Replay: `%s%sCHAOS_SEED=%d CHAOS_DURATION=%d make chaos`. The seed fixes the fault schedule, the workload's periods, trigger mix and lock-worker parameters; it does not fix timing (processes, the scheduler and the services decide when things happen) nor which process a fault hits (the owner of a running bill run at that moment, say), so a replay repeats the schedule, not the interleaving.\n\n",
		sabEnv, kinds, rep.Seed, int(r.cfg.Duration.Seconds()))

	w("## Faults injected\n\n| kind | count |\n|---|---|\n")
	for _, k := range sortedKeys(rep.Faults) {
		w("| %s | %d |\n", k, rep.Faults[k])
	}
	w("\n## Schedule as executed\n\nTwo schedules run side by side: the process and service faults, and the network faults (each through the target's own proxies).\n\n| at | kind | target | took | what happened |\n|---|---|---|---|---|\n")
	faults := slices.Clone(h.Faults)
	slices.SortStableFunc(faults, func(a, b FaultRecord) int { return cmp.Compare(a.StartNS, b.StartNS) })
	for _, f := range faults {
		tgt := f.Target
		if f.Skipped {
			tgt = "(nothing to hit)"
		}
		w("| %s | %s | %s | %s | %s |\n", h.rel(f.StartNS), f.Spec.Kind, mdEscape(tgt), time.Duration(f.EndNS-f.StartNS).Round(10*time.Millisecond), mdEscape(f.Detail))
	}
	if n := len(r.plan) + len(r.netPlan); len(h.Faults) < n {
		w("\n%d planned faults did not start before the phase ended (an earlier fault overran its estimate).\n", n-len(h.Faults))
	}
	if cs, os := h.cutOffs(), h.ownerCutOffs(); len(cs)+len(os) > 0 {
		w("\n## Lease holders cut off by a partition\n\nA holder cut off from Redis longer than its lease: once a newer holder has written, its writes must be refused (in-process workers: the fenced store, `two_writers_accepted`; bill-run owners: the batch statement's fence check, `stale_batch_commit`).\n\n")
		for _, c := range cs {
			w("- %s\n", mdEscape(c.String(h)))
		}
		for _, c := range os {
			w("- %s\n", mdEscape(c.String(h)))
		}
	}
	if vs := h.cronVerdicts(); len(vs) > 0 {
		n := map[string]int{}
		for _, v := range vs {
			n[v.how]++
		}
		w("\n## Bill-run cron ticks\n\nA tick every %s; what became of each (ran: an attempt completed the period or found it completed; recorded: deferred to the resumer; superseded: every attempt failed but one went on trying past the middle of the interval; in_flight: an attempt logged no end, its replica died; skipped: every replica still ran an earlier tick; unobserved: no replica logged it; dropped: an anomaly).\n\n| verdict | ticks |\n|---|---|\n", h.CronEvery)
		for _, k := range sortedKeys(n) {
			w("| %s | %d |\n", k, n[k])
		}
	}
	w("\n## Operations\n\n| operation | count |\n|---|---|\n")
	for _, k := range sortedKeys(rep.Operations) {
		w("| %s | %d |\n", k, rep.Operations[k])
	}
	w("\n## Anomalies\n\n")
	if len(anomalies) == 0 {
		w("None. Every check below held.\n\n")
	}
	byKind := map[string][]Anomaly{}
	for _, a := range anomalies {
		byKind[a.Kind] = append(byKind[a.Kind], a)
	}
	for _, k := range sortedKeys(byKind) {
		as := byKind[k]
		w("### %s (%d)\n\n%s\n\n", k, len(as), kindDocs[k])
		for i, a := range as {
			if i == 20 {
				w("- ... and %d more (report.json lists up to %d, history.json has the data)\n", len(as)-20, maxPerKind)
				break
			}
			w("- %s\n", mdEscape(a.Detail))
		}
		w("\n")
	}
	if ex := h.excusedOverlaps(); len(ex) > 0 {
		w("## Excused overlaps (%d)\n\nTwo holders at once where the lock documents that it cannot prevent it and the fence protects a fenced store (the stale holder's fence is the lower one): its `coordinator lock` was stopped by the verifier, or the lock was lost with a Redis restart or failover (docs/lock.md). Not anomalies; listed so that nothing is hidden.\n\n", len(ex))
		for i, e := range ex {
			if i == 20 {
				w("- ... and %d more\n", len(ex)-20)
				break
			}
			w("- %s\n", mdEscape(e))
		}
		w("\n")
	}
	w("## The checks\n\n")
	names := make([]string, 0, len(kindDocs))
	for k := range kindDocs {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		mark := "held"
		if len(byKind[k]) > 0 {
			mark = fmt.Sprintf("**%d found**", len(byKind[k]))
		}
		w("- `%s` (%s): %s\n", k, mark, kindDocs[k])
	}
	w("\nFiles beside this report: `report.json`, `schedule.json` (the plan the seed gave), `history.json` (everything the checks read), `logs/` (every process's output).\n")
	return b.String()
}

func mdEscape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", "\\|"), "\n", " ")
}

// kindDocs says what each anomaly means and where to look.
var kindDocs = map[string]string{
	KindInvoiceMissing:       "a period is COMPLETED but some billable subscriber has no invoice for it (a committed batch skipped, or a range never planned).",
	KindInvoiceDuplicate:     "more than one invoice for one (subscriber, period): the unique index uidx_invoices_sub_period is missing or bypassed.",
	KindInvoiceWrongAmount:   "an invoice's amount is not the monthly fee plus the period's usage charges.",
	KindInvoiceUnexpected:    "an invoice for a subscriber who is not billable in the period.",
	KindRunNotCompleted:      "a period with an accepted trigger (Kafka acknowledged, HTTP 202/200/409, or a cron tick) did not end COMPLETED within the recovery bound after the faults stopped, with no further trigger: a trigger was lost (committed although its run never finished, or never resumed).",
	KindStaleBatchCommit:     "a bill-run batch committed under a claim fence lower than one already committed for the same period: a stale owner wrote after a newer owner claimed (the Postgres fence check failed).",
	KindStaleWrite:           "a lock worker's fenced row committed with a fence lower than one already committed for the same key: a stale holder (or a process it left behind) wrote after a newer holder, or fences went backwards.",
	KindFenceNotIncreasing:   "a later acquisition of a key got a fencing token not above the previous one (lock workers: in the order their commands started; replicas: ownership.acquired in event order). Typical cause: the fence counter lost with Redis (restart without persistence, failover to a replica that missed the INCR).",
	KindMutualExclusion:      "two `coordinator lock` holders of one key were inside their critical sections at the same time, both believing they held the lock (intervals on CLOCK_MONOTONIC, shared by all processes on the host).",
	KindHolderOutlived:       "a process of a holder's command tree (the command or a child it left) recorded work after its `coordinator lock` had exited, i.e. after the lock was released or abandoned.",
	KindProcessStillRunning:  "a process of a holder's command tree was still running after its `coordinator lock` exited (checked 0.3 s after each exit and at the end).",
	KindEventsRunCompleted:   "the events disagree with Postgres: a COMPLETED period without exactly one run.completed id (re-published copies share it) or whose event id is not the one bill_runs stored, or a run.completed for a period that is not COMPLETED.",
	KindEventsUnended:        "an ownership.acquired with neither ownership.released nor ownership.lost from the same replica for the same term (lock fence), although that replica did not crash.",
	KindPoisonNotDeadLetter:  "a malformed or oversized trigger never reached coordinator.triggers.dlq.",
	KindStaleReservationLeft: "expired MSISDN reservations were still RESERVED at the end: the reaper did not sweep.",
	KindLiveReservationFreed: "a reservation whose hold had not expired was freed by the reaper.",
	KindReplicaExited:        "a replica exited on its own (crash, fatal error) during the run.",
	KindReplicaShutdownHung:  "a replica did not finish its graceful shutdown within COORDINATOR_SHUTDOWN_TIMEOUT + 10 s after SIGTERM.",
	KindLockUsageError:       "`coordinator lock` rejected the verifier's invocation (exit 64): the CLI changed; the verifier must follow.",
	KindCronTickDropped:      "a bill-run cron tick that fired on the replicas was neither run (completed, or found completed) nor recorded for the resumer by any of them, and no attempt went on trying into the second half of the interval: the tick was dropped (issue 23).",
	KindTwoWritersAccepted:   "the in-process workers' fenced store accepted a holder's write after a newer holder's write had been accepted for the same key: two writers accepted (equal or backward fences let the old holder back in).",
}

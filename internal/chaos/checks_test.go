package chaos

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Each checker is shown a synthetic history that violates its property and
// one that does not: a checker that cannot fail proves nothing.

const sec = int64(time.Second)

func kinds(as []Anomaly) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Kind)
	}
	return out
}

func requireKinds(t *testing.T, as []Anomaly, want ...string) {
	t.Helper()
	got := kinds(as)
	slices.Sort(got)
	slices.Sort(want)
	require.Equal(t, want, got, "anomalies: %+v", as)
}

func TestCheckInvoices(t *testing.T) {
	h := &History{BillRuns: []BillRunRow{{Period: "2026-01", Status: "COMPLETED"}, {Period: "2026-02", Status: "RUNNING"}}}
	h.Invoices = []InvoiceStat{
		{Period: "2026-01", Expected: 10, Invoices: 10},
		{Period: "2026-02", Expected: 10, Invoices: 4, Missing: 6}, // still running: not yet missing
	}
	requireKinds(t, checkInvoices(h))

	h.Invoices = []InvoiceStat{
		{Period: "2026-01", Expected: 10, Invoices: 9, Missing: 1, Sample: []int64{7}},
		{Period: "2026-02", Expected: 10, Invoices: 12, Duplicates: 1, WrongAmount: 1, Unexpected: 1},
	}
	requireKinds(t, checkInvoices(h), KindInvoiceMissing, KindInvoiceDuplicate, KindInvoiceWrongAmount, KindInvoiceUnexpected)
}

func TestCheckCompletion(t *testing.T) {
	h := &History{StartNS: 1, FaultsEndNS: 100 * sec, CheckNS: 130 * sec,
		Triggers: []TriggerRecord{
			{Source: "kafka", Period: "2026-01", Accepted: true, AtNS: 2 * sec},
			{Source: "http", Period: "2026-02", Accepted: true, Status: 202, AtNS: 3 * sec},
			{Source: "http", Period: "2026-03", Accepted: false, Status: 503, AtNS: 4 * sec}, // refused: the caller retries
		},
		CronTicks: []CronTick{{AtNS: 5 * sec, Period: "2026-11"}},
		BillRuns: []BillRunRow{{Period: "2026-01", Status: "COMPLETED"}, {Period: "2026-02", Status: "COMPLETED"},
			{Period: "2026-11", Status: "COMPLETED"}},
	}
	requireKinds(t, checkCompletion(h))

	h.BillRuns = []BillRunRow{{Period: "2026-01", Status: "COMPLETED"}, {Period: "2026-02", Status: "INTERRUPTED", LastError: "interrupted: lease_lost"}}
	got := checkCompletion(h)
	requireKinds(t, got, KindRunNotCompleted, KindRunNotCompleted) // 2026-02 interrupted, 2026-11 (cron) never claimed
	require.Contains(t, got[0].Detail, "INTERRUPTED")
	require.Contains(t, got[1].Detail, "no bill_runs row")
}

func TestCheckBatchFences(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	h := &History{Batches: []BatchRow{
		{Period: "2026-01", FirstID: 1, Fence: 1, CommittedAt: at(0)},
		{Period: "2026-01", FirstID: 26, Fence: 1, CommittedAt: at(10)},
		{Period: "2026-01", FirstID: 51, Fence: 2, CommittedAt: at(500)}, // resumed by a new claim
		{Period: "2026-02", FirstID: 1, Fence: 5, CommittedAt: at(5)},
	}}
	requireKinds(t, checkBatchFences(h))

	h.Batches = append(h.Batches, BatchRow{Period: "2026-01", FirstID: 76, Fence: 1, Owner: "r1-1", CommittedAt: at(600)})
	got := checkBatchFences(h)
	requireKinds(t, got, KindStaleBatchCommit)
	require.Contains(t, got[0].Detail, "under fence 1")

	// The newer owner committed no batch yet, but its claim had taken
	// effect: a batch under the old fence after it is stale too.
	h.Batches = []BatchRow{{Period: "2026-03", FirstID: 1, Fence: 1, CommittedAt: at(0)}, {Period: "2026-03", FirstID: 26, Fence: 1, CommittedAt: at(300)}}
	h.BillRunLog = []BillRunChange{{Period: "2026-03", Fence: 1, Status: "RUNNING", CommittedAt: at(-10)}}
	requireKinds(t, checkBatchFences(h))
	h.BillRunLog = append(h.BillRunLog, BillRunChange{Period: "2026-03", Fence: 2, Owner: "r2-1", Status: "RUNNING", CommittedAt: at(200)})
	got = checkBatchFences(h)
	requireKinds(t, got, KindStaleBatchCommit)
	require.Contains(t, got[0].Detail, "the claim of fence 2 by r2-1")
}

func TestCheckWrites(t *testing.T) {
	sections := []Section{
		{Key: "k", Fence: 1, LockPID: 10, PID: 11, StartNS: 1 * sec, EndNS: 2 * sec},
		{Key: "k", Fence: 2, LockPID: 20, PID: 21, StartNS: 3 * sec, EndNS: 4 * sec},
	}
	h := &History{Sections: sections, Writes: []Write{
		{ID: 1, Key: "k", Fence: 1, LockPID: 10, PID: 11, Role: "section"},
		{ID: 2, Key: "k", Fence: 1, LockPID: 10, PID: 11, Role: "section"},
		{ID: 3, Key: "k", Fence: 2, LockPID: 20, PID: 21, Role: "section"},
	}}
	requireKinds(t, checkWrites(h))

	// A process left behind by the fence-1 holder writes after the fence-2 holder.
	h.Writes = append(h.Writes, Write{ID: 4, Key: "k", Fence: 1, LockPID: 10, PID: 12, Role: "late", MonoNS: 5 * sec})
	got := checkWrites(h)
	requireKinds(t, got, KindStaleWrite)
	require.Contains(t, got[0].Detail, "left running")

	// Fences went backwards: a holder that started after the fence-2 holder
	// finished got fence 1 (a Redis restart without persistence).
	h.Writes = h.Writes[:3]
	h.Sections = append(sections,
		Section{Key: "k", Fence: 1, LockPID: 30, PID: 31, StartNS: 6 * sec, EndNS: 7 * sec},
		Section{Key: "k", Fence: 2, LockPID: 40, PID: 41, StartNS: 8 * sec, EndNS: 9 * sec})
	h.Writes = append(h.Writes,
		Write{ID: 5, Key: "k", Fence: 1, LockPID: 30, PID: 31, Role: "section"},
		Write{ID: 6, Key: "k", Fence: 2, LockPID: 40, PID: 41, Role: "section"}) // equal to the top: not below
	got = checkWrites(h)
	requireKinds(t, got, KindStaleWrite)
	require.Contains(t, got[0].Detail, "fences went backwards")
}

func TestCheckFenceOrder(t *testing.T) {
	wall := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	h := &History{
		Sections: []Section{
			{Key: "k", Fence: 1, LockPID: 10, StartNS: 1 * sec},
			{Key: "k", Fence: 3, LockPID: 20, StartNS: 2 * sec},
			{Key: "j", Fence: 1, LockPID: 30, StartNS: 3 * sec},
		},
		Events: []Event{
			{Type: "ownership.acquired", Subject: "billrun:2026-01", Replica: "r1-1", Time: wall, LockFence: 4, HasLock: true},
			{Type: "ownership.acquired", Subject: "billrun:2026-01", Replica: "r2-1", Time: wall.Add(time.Second), LockFence: 5, HasLock: true},
			{Type: "ownership.acquired", Subject: "msisdn-reaper:sweep", Replica: "r2-1", Time: wall, Fence: 9},
		},
	}
	requireKinds(t, checkFenceOrder(h))

	h.Sections = append(h.Sections, Section{Key: "k", Fence: 1, LockPID: 40, StartNS: 4 * sec})
	h.Events = append(h.Events, Event{Type: "ownership.acquired", Subject: "msisdn-reaper:sweep", Replica: "r3-1", Time: wall.Add(time.Second), Fence: 1})
	requireKinds(t, checkFenceOrder(h), KindFenceNotIncreasing, KindFenceNotIncreasing)
}

func TestCheckMutualExclusion(t *testing.T) {
	h := &History{Sections: []Section{
		{Key: "k", Fence: 1, LockPID: 10, StartNS: 1 * sec, EndNS: 2 * sec},
		{Key: "k", Fence: 2, LockPID: 20, StartNS: 2 * sec, EndNS: 3 * sec}, // starts as the first ends
		{Key: "j", Fence: 1, LockPID: 30, StartNS: 1 * sec, EndNS: 5 * sec}, // another key
		{Key: "k", Fence: 3, LockPID: 40, StartNS: 3*sec + 1, EndNS: 0},     // never finished: not believed held to the end
	}}
	requireKinds(t, checkMutualExclusion(h))

	h.Sections = append(h.Sections, Section{Key: "k", Fence: 4, LockPID: 50, StartNS: 2*sec + sec/2, EndNS: 4 * sec})
	got := checkMutualExclusion(h)
	requireKinds(t, got, KindMutualExclusion)
	require.Contains(t, got[0].Detail, "500ms")
}

// A holder whose `coordinator lock` the verifier stopped runs on
// unsupervised: its overlap is excused only if its fence is below the
// newer holder's (a fenced store refuses it).
func TestCheckMutualExclusionPausedHolder(t *testing.T) {
	h := &History{
		Sections: []Section{
			{Key: "k", Fence: 5, LockPID: 10, LockStart: 1, StartNS: 1 * sec, EndNS: 5 * sec}, // ran on while its lock was stopped
			{Key: "k", Fence: 6, LockPID: 20, LockStart: 2, StartNS: 4 * sec, EndNS: 4*sec + sec/2},
		},
		LockRuns: []LockRun{{PID: 10, StartTime: 1, Paused: true, PausedNS: 2 * sec, ResumedNS: 6 * sec}},
	}
	requireKinds(t, checkMutualExclusion(h))
	h.Sections[1].Fence = 5 // the newer holder got no higher fence: nothing protects the store
	requireKinds(t, checkMutualExclusion(h), KindMutualExclusion)
	h.Sections[1].Fence = 6
	h.LockRuns[0].Paused = false // not paused: the product had no excuse
	requireKinds(t, checkMutualExclusion(h), KindMutualExclusion)

	// The lock lost with a Redis restart: excused while the fences order the holders.
	h.Faults = []FaultRecord{{Spec: FaultSpec{Kind: FaultRedisRestart}, StartNS: 3 * sec}}
	requireKinds(t, checkMutualExclusion(h))
	require.Len(t, h.excusedOverlaps(), 1)
	h.Sections[1].Fence = 1 // the fence went back with Redis: nothing protects the store
	requireKinds(t, checkMutualExclusion(h), KindMutualExclusion)
	h.Sections[1].Fence = 6
	h.Faults[0].Spec.Kind = FaultRedisStall // a stall loses no key: the lease should have ended in time
	requireKinds(t, checkMutualExclusion(h), KindMutualExclusion)
}

func TestCheckTrees(t *testing.T) {
	h := &History{
		LockRuns: []LockRun{{PID: 10, StartTime: 100, ExitNS: 5 * sec}},
		Procs: []HelperProc{
			{PID: 11, StartTime: 110, LockPID: 10, LockStart: 100, Role: "command", EndedNS: 4 * sec},
			{PID: 12, StartTime: 120, LockPID: 10, LockStart: 100, Role: "linger"}, // killed: no end recorded
		},
	}
	requireKinds(t, checkTrees(h))

	h.Procs[1].EndedNS = 6 * sec
	h.StillRunning = []StillRunning{{HelperProc: h.Procs[1], HolderExitNS: 5 * sec, SeenNS: 5*sec + sec/3}}
	requireKinds(t, checkTrees(h), KindHolderOutlived, KindProcessStillRunning)

	// A later process with the same PIDs (PIDs wrap on a long run) is not it.
	h.StillRunning = nil
	h.Procs[1].EndedNS = 0
	h.Writes = []Write{{ID: 1, Key: "k", Fence: 9, LockPID: 10, LockStart: 999, PID: 12, Role: "section", MonoNS: 70 * sec}}
	requireKinds(t, checkTrees(h))

	// A late write counts as work after the holder exited, too.
	h.StillRunning = nil
	h.Procs[1].EndedNS = 0
	h.Writes = []Write{{ID: 1, Key: "k", Fence: 1, LockPID: 10, LockStart: 100, PID: 12, Role: "late", MonoNS: 7 * sec}}
	requireKinds(t, checkTrees(h), KindHolderOutlived)
}

func TestCheckEvents(t *testing.T) {
	wall := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ev := func(typ, subj, replica string, lf int64) Event {
		return Event{Type: typ, Subject: subj, Replica: replica, Time: wall, LockFence: lf, HasLock: true, Fence: lf}
	}
	h := &History{
		Replicas: []ReplicaRun{{ID: "r1-1", StoppedByVerifier: true, ExitNS: 9}, {ID: "r2-1", KilledByVerifier: true, ExitNS: 9}},
		BillRuns: []BillRunRow{{Period: "2026-01", Status: "COMPLETED", Owner: "r1-1"}, {Period: "2026-02", Status: "RUNNING"}},
		Events: []Event{
			ev("ownership.acquired", "billrun:2026-01", "r1-1", 3),
			ev("run.completed", "billrun:2026-01", "r1-1", 3),
			ev("ownership.released", "billrun:2026-01", "r1-1", 3),
			ev("ownership.acquired", "billrun:2026-02", "r2-1", 4), // r2-1 was SIGKILLed: a crash ends the term
			{Type: "ownership.acquired", Subject: "msisdn-reaper:sweep", Replica: "r1-1", Fence: 7},
			{Type: "ownership.released", Subject: "msisdn-reaper:sweep", Replica: "r1-1", Fence: 7},
		},
	}
	requireKinds(t, checkEvents(h))

	h.Events = append(h.Events,
		ev("ownership.acquired", "billrun:2026-02", "r1-1", 5), // no end, no crash
		ev("run.completed", "billrun:2026-02", "r1-1", 5),      // but the period is not COMPLETED
	)
	h.BillRuns = append(h.BillRuns, BillRunRow{Period: "2026-03", Status: "COMPLETED", Owner: "r2-1"}) // no run.completed
	got := checkEvents(h)
	requireKinds(t, got, KindEventsRunCompleted, KindEventsRunCompleted, KindEventsUnended)

	h.Events = append(h.Events, ev("run.completed", "billrun:2026-01", "r2-1", 9)) // a second completion
	requireKinds(t, checkEvents(h), KindEventsRunCompleted, KindEventsRunCompleted, KindEventsRunCompleted, KindEventsUnended)
}

// A run.completed published again (its owner was killed before Kafka
// acknowledged it, and a resumer re-published it) repeats the event id: two
// events of one id are one completion. Two ids for one period are two.
func TestCheckEventsCountsCompletionsByEventID(t *testing.T) {
	wall := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	completed := func(id, replica string) Event {
		return Event{ID: id, Type: "run.completed", Subject: "billrun:2026-01", Replica: replica, Time: wall, Fence: 3, LockFence: 3, HasLock: true}
	}
	h := &History{
		Replicas: []ReplicaRun{{ID: "r1-1", KilledByVerifier: true, ExitNS: 9}, {ID: "r2-1", StoppedByVerifier: true, ExitNS: 9}},
		BillRuns: []BillRunRow{{Period: "2026-01", Status: "COMPLETED", Owner: "r1-1", Fence: 3}},
		Events:   []Event{completed("c0ffee", "r1-1"), completed("c0ffee", "r1-1")}, // the owner's and a re-publication
	}
	requireKinds(t, checkEvents(h))

	h.Events = []Event{completed("c0ffee", "r1-1")}
	requireKinds(t, checkEvents(h))

	h.Events = append(h.Events, completed("beef", "r2-1"))
	requireKinds(t, checkEvents(h), KindEventsRunCompleted)

	h.Events = nil
	requireKinds(t, checkEvents(h), KindEventsRunCompleted)

	// The id must be the one the completion stored.
	h.BillRuns[0].EventID = "c0ffee"
	h.Events = []Event{completed("c0ffee", "r1-1"), completed("c0ffee", "r2-1")}
	requireKinds(t, checkEvents(h))
	h.Events = []Event{completed("feed", "r1-1")}
	requireKinds(t, checkEvents(h), KindEventsRunCompleted)
}

func TestCheckPoison(t *testing.T) {
	h := &History{
		Poison: []PoisonRecord{
			{Kind: "poison", Topic: topicBillrun, Partition: 1, Offset: 7, Produced: true, Marker: "m1"},
			{Kind: "oversized", Topic: topicBillrun, Partition: 2, Offset: 9, Produced: true, Marker: "m2"},
			{Kind: "poison", Produced: false}, // never produced: nothing to dead-letter
		},
		DLQ: []DLQRecord{
			{SourceTopic: topicBillrun, SourcePartition: 1, SourceOffset: 7},
			{SourcePartition: -1, SourceOffset: -1, Prefix: `{"period":"2026-01","request_id":"m2"`},
		},
	}
	requireKinds(t, checkPoison(h))
	h.DLQ = h.DLQ[:1]
	requireKinds(t, checkPoison(h), KindPoisonNotDeadLetter)
}

func TestCheckPoolReplicasLockRuns(t *testing.T) {
	h := &History{
		Pool:     PoolStat{LiveSeeded: 20, LiveLeft: 20, StaleSeen: 300},
		Replicas: []ReplicaRun{{ID: "r1-1", ReadyNS: 1, ExitNS: 2, KilledByVerifier: true}, {ID: "r1-2", ReadyNS: 1, ExitNS: 0}},
		LockRuns: []LockRun{{Exit: 0}, {Exit: 76}},
	}
	require.Empty(t, checkPool(h))
	require.Empty(t, checkReplicas(h))
	require.Empty(t, checkLockRuns(h))

	h.Pool = PoolStat{LiveSeeded: 20, LiveLeft: 19, StaleLeft: 3}
	h.Replicas = append(h.Replicas, ReplicaRun{ID: "r2-1", ReadyNS: 1, ExitNS: 5, Exit: 2}, ReplicaRun{ID: "r3-1", StoppedByVerifier: true, ShutdownKilled: true, ExitNS: 9})
	h.LockRuns = append(h.LockRuns, LockRun{Exit: 64, Key: "k"})
	requireKinds(t, checkPool(h), KindStaleReservationLeft, KindLiveReservationFreed)
	requireKinds(t, checkReplicas(h), KindReplicaExited, KindReplicaShutdownHung)
	requireKinds(t, checkLockRuns(h), KindLockUsageError)
}

func TestCapAnomalies(t *testing.T) {
	var as []Anomaly
	for i := 0; i < maxPerKind+5; i++ {
		as = append(as, Anomaly{Kind: KindStaleWrite, Detail: "x"})
	}
	as = append(as, Anomaly{Kind: KindMutualExclusion, Detail: "y"})
	got := capAnomalies(as)
	require.Len(t, got, maxPerKind+2)
	require.Contains(t, got[len(got)-1].Detail, "5 more")
	require.NotNil(t, capAnomalies(nil), "report.json lists [] when there is none")
}

func TestPlan(t *testing.T) {
	a := Plan(42, 300*time.Second, nil, false)
	require.Equal(t, a, Plan(42, 300*time.Second, nil, false), "a seed gives one schedule")
	require.NotEqual(t, a, Plan(43, 300*time.Second, nil, false))
	seen := map[string]bool{}
	var end time.Duration
	for _, f := range a {
		seen[f.Kind] = true
		require.GreaterOrEqual(t, f.At, end, "faults do not overlap: %s", f)
		end = f.At + estimate(f)
		require.LessOrEqual(t, end, 300*time.Second-tailQuiet)
	}
	for _, k := range ProcessFaults {
		require.True(t, seen[k], "a 300s phase has every kind: %s missing", k)
	}
	for _, k := range NetFaults {
		require.False(t, seen[k], "network faults have a schedule of their own: %s", k)
	}
	s := Plan(42, 120*time.Second, nil, true)
	require.Equal(t, FaultPauseReplica, s[0].Kind, "sabotage: pause-replica first")

	only := Plan(7, 60*time.Second, []string{FaultRedisStall}, false)
	require.NotEmpty(t, only)
	for _, f := range only {
		require.Equal(t, FaultRedisStall, f.Kind)
		require.Greater(t, f.Hold, redisReadTimeout, "a stall outlasts the client's read timeout")
	}
	for _, f := range Plan(9, 200*time.Second, []string{FaultPauseReplica, FaultPauseLockHolder}, false) {
		ttl := replicaWatchdogTTL
		if f.Kind == FaultPauseLockHolder {
			ttl = lockWatchdogTTL
		}
		require.Greater(t, f.Hold, ttl, "a pause outlasts the lease: %s", f)
	}
	_, err := ParseFaultKinds("kill-replica,bogus")
	require.Error(t, err)
}

func TestPlanNet(t *testing.T) {
	a := PlanNet(42, 300*time.Second, nil)
	require.Equal(t, a, PlanNet(42, 300*time.Second, nil), "a seed gives one schedule")
	require.NotEqual(t, a, PlanNet(43, 300*time.Second, nil))
	seen := map[string]bool{}
	var end time.Duration
	for _, f := range a {
		seen[f.Kind] = true
		require.True(t, isNetFault(f.Kind), f.String())
		require.GreaterOrEqual(t, f.At, end, "network faults do not overlap each other: %s", f)
		end = f.At + f.Hold
		require.LessOrEqual(t, end, 300*time.Second-tailQuiet)
		switch f.Kind {
		case FaultPartitionRedis, FaultPartitionAll:
			require.Greater(t, f.Hold, replicaWatchdogTTL, "a partition from Redis outlasts the lease: %s", f)
		case FaultLatency:
			require.GreaterOrEqual(t, f.Latency, 200*time.Millisecond, f.String())
			require.LessOrEqual(t, f.Latency, 2000*time.Millisecond, f.String())
			require.Positive(t, f.Jitter, f.String())
		case FaultPartitionKafka, FaultPartitionPostgres:
			require.False(t, f.OnWorker, "these cut a replica off: %s", f)
		}
		if f.Dep == depKafka {
			require.False(t, f.OnWorker, "lock workers have no Kafka link: %s", f)
		}
	}
	for _, k := range NetFaults {
		require.True(t, seen[k], "a 300s phase has every network kind: %s missing", k)
	}
	require.Empty(t, PlanNet(42, 300*time.Second, []string{FaultKillReplica}), "no network kind enabled")
	for _, f := range PlanNet(5, 120*time.Second, []string{FaultSlicer}) {
		require.Equal(t, FaultSlicer, f.Kind)
	}
}

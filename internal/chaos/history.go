package chaos

import "time"

// History is everything the verifier recorded and read back after a run:
// its own operations and faults, the rows the critical-section helpers and
// the product wrote to PostgreSQL, and the events on Kafka. The checkers
// (checks*.go) are pure functions over it, so each can be tested on a
// synthetic history.
//
// Times ending in NS are CLOCK_MONOTONIC nanoseconds (Mono), one clock for
// every process on the host. Event times are the replicas' wall clocks.
type History struct {
	// StartNS is when the fault phase began (the origin of every +t in a
	// detail); WallStart the wall-clock time at StartNS (for event times).
	StartNS   int64
	WallStart time.Time
	// FaultsEndNS is when the fault phase ended; CheckNS when the recovery
	// phase ended and the final state was read.
	FaultsEndNS int64
	CheckNS     int64

	Faults   []FaultRecord
	Triggers []TriggerRecord
	// CronTicks are the bill-run cron ticks that fired while at least one
	// replica ran, with the period each bills; CronEvery their interval;
	// CronLines what the replicas logged about them.
	CronTicks []CronTick
	CronEvery time.Duration
	CronLines []CronLine
	Poison    []PoisonRecord
	DLQ       []DLQRecord

	Replicas []ReplicaRun
	LockRuns []LockRun

	// Rows written by the critical-section helpers.
	Sections []Section
	Writes   []Write
	Procs    []HelperProc
	// StillRunning are helper processes found alive after their holder's
	// `coordinator lock` had exited (checked shortly after each exit).
	StillRunning []StillRunning

	// The in-process lock workers' leases, their fenced store's writes (read
	// back at CheckNS) and how many acquisitions failed (busy: already
	// owned at the end of the wait; unavailable: Redis unreachable).
	Inproc            []InprocSection
	FencedWrites      []FencedWrite
	InprocBusy        int64
	InprocUnavailable int64

	// The product's tables, read at CheckNS.
	BillRuns []BillRunRow
	// BillRunLog is every committed change of a bill_runs row (claims,
	// endings), in order, with its commit time.
	BillRunLog []BillRunChange
	Batches    []BatchRow
	Invoices   []InvoiceStat
	Pool       PoolStat

	Events []Event
}

// FaultRecord is one injected fault as it happened.
type FaultRecord struct {
	Spec    FaultSpec
	StartNS int64
	EndNS   int64
	Target  string // what it hit: "r2-3 (pid 1234, owner of billrun:2025-03)", "redis-0 (master, port 1234)"
	Detail  string
	// Skipped: there was nothing to hit (no replica up, no lock held).
	Skipped bool

	// Network faults: the host hit (a replica slot r2, a `coordinator lock`
	// worker lw1, an in-process worker iw0) and the dependencies its links
	// lead to. Holder: the in-process lease the host held when the fault
	// began ("iw1-57"), so the report can show it fenced off.
	Host   string   `json:",omitempty"`
	Deps   []string `json:",omitempty"`
	Holder string   `json:",omitempty"`
	// Replica, Period: the replica hit owned the bill run of Period then.
	Replica string `json:",omitempty"`
	Period  string `json:",omitempty"`
	// Lost commits: commits were asynchronous from StartNS to CrashNS (the
	// last immediate shutdown); LostWAL is how much WAL, at least, did not
	// survive the crashes (inserted before the crash, past the end of
	// recovery): the last commits, the same for every table.
	CrashNS int64 `json:",omitempty"`
	LostWAL int64 `json:",omitempty"`
}

// TriggerRecord is one bill-run trigger the verifier sent.
type TriggerRecord struct {
	Source    string // kafka, http
	Period    string
	RequestID string
	AtNS      int64
	// Accepted: Kafka acknowledged the record, or the HTTP answer was 202,
	// 200 (already completed) or 409 (owned by another replica, whose run
	// must then finish).
	Accepted bool
	// Status is the HTTP status (0 for Kafka) or the produce error.
	Status int
	Error  string
	// Replica that answered an HTTP trigger.
	Replica string
	// Note says why the trigger was sent ("takeover during pause", "behind poison").
	Note string
	// Attempt: 0 for the first, n for the n-th time an HTTP trigger was
	// sent again (after a 503 or 429, or no answer).
	Attempt int `json:",omitempty"`
}

// CronTick is a bill-run cron tick (COORDINATOR_BILLRUN_SCHEDULE): its
// scheduled time (At, wall clock), the period it bills and the replicas
// that were running (ready, not stopped) when it fired.
type CronTick struct {
	AtNS   int64
	At     time.Time
	Period string
	Live   []string
}

// CronLine is one line of a replica's log about a bill-run cron tick: the
// first line of each attempt (request id), its trigger_dispatched line(s),
// cron_catchup_tick (Scheduled: the tick it catches up) and
// cron_tick_skipped (Scheduled: the tick skipped because the replica's
// previous tick still ran).
type CronLine struct {
	Replica   string
	Msg       string
	RequestID string    `json:",omitempty"`
	Time      time.Time // the replica's log time
	Outcome   string    `json:",omitempty"`
	Deferred  bool      `json:",omitempty"`
	Scheduled time.Time `json:",omitempty"`
}

// PoisonRecord is a malformed or oversized trigger the verifier produced.
type PoisonRecord struct {
	Kind      string // poison, oversized
	Topic     string
	Partition int32
	Offset    int64
	Size      int
	Marker    string
	AtNS      int64
	Produced  bool
	Error     string
}

// DLQRecord is one record read back from the dead-letter topic.
type DLQRecord struct {
	SourceTopic     string
	SourcePartition int32
	SourceOffset    int64
	Reason          string
	Prefix          string // the first bytes of the value
	Size            int
}

// ReplicaRun is one incarnation of a `coordinator serve` process.
type ReplicaRun struct {
	ID      string // COORDINATOR_REPLICA_ID, unique per incarnation: r2#3
	Slot    int
	PID     int
	StartNS int64
	ReadyNS int64 // 0: never logged coordinator_started
	ExitNS  int64 // 0: still running at CheckNS (should not happen)
	Exit    int
	// KilledByVerifier: the verifier SIGKILLed it (a crash it caused).
	KilledByVerifier bool
	// StoppedByVerifier: the verifier sent SIGTERM at the end.
	StoppedByVerifier bool
	// ShutdownKilled: it did not exit within its bound after SIGTERM.
	ShutdownKilled bool
	Tail           []string
}

// LockRun is one `coordinator lock` process of a lock worker.
type LockRun struct {
	Worker    int
	Key       string
	PID       int
	StartTime uint64
	StartNS   int64
	ExitNS    int64
	Exit      int
	Lease     time.Duration // 0: watchdog
	Killed    bool          // SIGKILLed by the verifier
	Paused    bool          // SIGSTOPped by the verifier
	// PausedNS..ResumedNS: the verifier had it stopped (its command ran on
	// unsupervised).
	PausedNS, ResumedNS int64
	Tail                []string
}

// Section is one critical section as its helper recorded it: from the
// moment the command started (the lock was held) to the moment it finished
// its work, still believing it held the lock. EndNS 0: it never finished
// (killed, or its database write failed).
type Section struct {
	ID        int64
	Key       string
	Fence     int64
	Owner     string
	LockPID   int
	LockStart uint64
	PID       int
	StartNS   int64
	EndNS     int64
}

// Write is one row appended inside a critical section (role "section") or
// by a process left behind by one (role "late"). IDs are commit order per
// key: writes of one key are serialised by an advisory lock.
type Write struct {
	ID        int64
	Key       string
	Fence     int64
	LockPID   int
	LockStart uint64
	PID       int
	Role      string
	MonoNS    int64
}

// HelperProc is a process of a holder's tree that registered itself: the
// command ("command") or a child it left running ("linger", "escaped").
type HelperProc struct {
	PID       int
	StartTime uint64
	LockPID   int
	LockStart uint64
	Role      string
	Key       string
	Fence     int64
	StartedNS int64
	EndedNS   int64 // 0: did not record an end (killed, as it should be)
}

// StillRunning is a helper process seen alive after its holder exited.
type StillRunning struct {
	HelperProc
	HolderExitNS int64
	SeenNS       int64
}

// BillRunRow is a bill_runs row at CheckNS.
type BillRunRow struct {
	Period     string
	Status     string
	Owner      string
	Fence      int64
	LockFence  int64
	Attempts   int
	LastError  string
	FinishedNS int64 // wall time of finished_at, Unix ns (0 if NULL)
	// EventID is completion_event_id: the id its run.completed must carry
	// ("" when none was stored).
	EventID string
}

// BillRunChange is one committed insert or update of a bill_runs row.
type BillRunChange struct {
	ID          int64
	Period      string
	Status      string
	Owner       string
	Fence       int64
	LockFence   int64
	Op          string // INSERT, UPDATE
	CommittedAt time.Time
	EventID     string // completion_event_id after the change
}

// InprocSection is one lease of an in-process lock worker, as the worker
// saw it: Acquire called at CallNS, returned at AcquiredNS, the lease given
// up at EndNS (LostNS: when the worker found it had ended without a
// release), and how its fenced writes went (Unknown: an error, it may have
// committed).
type InprocSection struct {
	Worker     int
	Key        string
	Holder     string // iw1-57: worker 1, its 57th acquisition attempt
	Fence      int64
	Lease      time.Duration // 0: watchdog
	CallNS     int64
	AcquiredNS int64
	EndNS      int64
	LostNS     int64 `json:",omitempty"`
	Accepted   int
	Refused    int
	Unknown    int
}

// FencedWrite is one write the in-process workers' fenced store took: ids
// are commit order per key; Accepted: its fence was at least the highest
// the key had accepted.
type FencedWrite struct {
	ID          int64
	Key         string
	Fence       int64
	Holder      string
	Accepted    bool
	MonoNS      int64
	CommittedAt time.Time
}

// BatchRow is a bill_run_batches row.
type BatchRow struct {
	Period      string
	FirstID     int64
	LastID      int64
	Fence       int64
	Owner       string
	CommittedAt time.Time // commit time of its transaction (track_commit_timestamp)
}

// InvoiceStat compares one period's invoices with what it should hold.
type InvoiceStat struct {
	Period   string
	Expected int64 // billable subscribers
	Invoices int64
	Missing  int64
	// Duplicates are (subscriber, period) pairs with more than one invoice.
	Duplicates int64
	// WrongAmount: invoices whose amount is not fee + the period's usage.
	WrongAmount int64
	// Unexpected: invoices of subscribers that are not billable.
	Unexpected int64
	Sample     []int64 // a few subscriber ids with a problem
}

// PoolStat is the MSISDN pool at CheckNS.
type PoolStat struct {
	// StaleLeft: RESERVED rows whose reserved_until passed more than a sweep
	// interval before CheckNS.
	StaleLeft int64
	// LiveSeeded / LiveLeft: reservations seeded with a hold far in the
	// future, and how many of them are still RESERVED.
	LiveSeeded int64
	LiveLeft   int64
	StaleSeen  int64 // stale reservations the verifier seeded over the run
}

// Event is a CloudEvent read back from the events topic.
type Event struct {
	// ID is the CloudEvents id: a re-published run.completed repeats it.
	ID        string
	Type      string
	Subject   string
	Time      time.Time
	Replica   string
	Trigger   string
	RequestID string
	Fence     int64
	LockFence int64
	HasLock   bool // data.lock_fence present
	Owner     string
	Reason    string
	Error     string
	Offset    int64
	Partition int32
	// A bill run's run.completed: the invoices of the period it reports
	// (data.period_invoices_created) and, where the product reports one,
	// the subscribers it repaired before completing (data.repaired).
	PeriodInvoices    int64 `json:",omitempty"`
	HasPeriodInvoices bool  `json:",omitempty"`
	Repaired          int64 `json:",omitempty"`
}

// lockFence is the Redis lock token of an event: data.lock_fence where
// present (bill runs), else data.fence (the reaper's fence is the lock's).
func (e Event) lockFence() int64 {
	if e.HasLock {
		return e.LockFence
	}
	return e.Fence
}

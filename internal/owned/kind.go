package owned

import (
	"context"
	"flag"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// Def defines a kind of owned run whose runs take parameters of type P
// (river's Worker[T]): Define turns it into the Kind the registry, the
// template and every transport use, and only this kind's functions ever see
// a P. Decode, LockKey and Open are required; the rest is optional.
type Def[P any] struct {
	// Spec names the kind and its trigger endpoints.
	Spec Spec
	// Decode turns a trigger's fields into P: the one place a kind judges
	// its input, whatever the source (a Kafka record, an HTTP body, the
	// CLI's flags, a request the resumer recorded). Input that can never
	// be run is a *RejectError (Reject): a Kafka record goes to the
	// dead-letter topic with its Reason, an HTTP call gets 400 (422 when
	// Unprocessable), the CLI exits 64.
	Decode func(in Input) (P, error)
	// RejectReasons are the reasons Decode's *RejectError can give besides
	// SharedRejectReasons. The Kafka consumer creates
	// coordinator_trigger_rejected_total{topic,reason} at 0 for each, so the
	// dead-letter alert's increase() sees the first rejection after a start
	// (a counter that first appears at 1 has no increase). Optional.
	RejectReasons []string
	// Encode is Decode's inverse: the Kafka record key (may be nil) and the
	// JSON fields of a trigger asking for p. `coordinator trigger` sends
	// them; the resumer records them. Required for a kind with a Topic or
	// a Worker.Incomplete.
	Encode func(p P) (key []byte, fields map[string]any)
	// Flags adds the kind's flags to fs (`coordinator run` and `trigger`)
	// and returns what turns them, once fs is parsed, and the positional
	// arguments left into a trigger's fields, which Decode then judges like
	// any other trigger's: Flags only maps, it does not validate (a flag
	// left unset is a field left out). Nil: the kind takes no flags and no
	// arguments.
	Flags func(fs *flag.FlagSet) func(args []string) (map[string]any, error)
	// LockKey is the ownership key of a run with p: Spec.Name, a colon, and
	// the rest. A kind owns its name's lock-key namespace.
	LockKey func(p P) string
	// RecordLockKey reads the lock key a Kafka record key names, so that a
	// rejected record's trigger.rejected names it. Nil, or false: the
	// event's subject is the kind's name.
	RecordLockKey func(recordKey []byte) (key string, ok bool)
	// StatusID is the id of the run p asks for (a bill run's period): GET
	// HTTPPath/{id} answers with the Worker's Status, and a 202 names that
	// URL. Set both or neither.
	StatusID func(p P) string
	// Open builds the kind's Worker from the deployment's dependencies. It
	// contacts nothing; a bad configuration is an error naming the field.
	// The kind's own settings are its package's Config, given when the
	// kind was made (internal/kinds maps the process's configuration).
	Open func(d Deps) (Worker[P], error)
}

// Worker is a kind's work in one deployment, with every capability it
// declares: Run is required; each other field, when set, makes the
// template do one thing more for the kind. Everything a kind can ask of
// the template is in this struct and in Def; nothing else is looked for.
type Worker[P any] struct {
	// Run does the work while the template holds the lock (and the claim).
	// ctx is cancelled when the lease is lost or the caller shuts down
	// (context.Cause is ErrShutdown then); stop at the next checkpoint.
	//
	// The Report goes into the result and the run's last event whatever the
	// error. A nil error is outcome completed; an error matching ErrLost is
	// lost (exit 76, not committed: a redelivery resumes); an error caused
	// by a lost lease or shutdown is lost too; any other error is failed.
	Run func(ctx context.Context, run *Run, p P) (Report, error)

	// Lease says how a run's lock is held. Nil: watchdog-managed, released
	// at once.
	Lease func(p P) Lease

	// Claim takes a claim in the kind's own store once the lock is held and
	// before Run (a bill run's fenced bill_runs row). It returns the
	// claim's fence: every event after it carries that fence
	// (data.lock_fence keeps the lock's). An error matching
	// ErrAlreadyCompleted (a *CompletedError) means there is nothing to do:
	// outcome already_completed, Run is not called. Other errors are
	// classified like Run's.
	Claim func(ctx context.Context, run *Run, p P) (fence int64, err error)

	// AlreadyCompleted looks, before the lock is taken, whether a run with
	// p has nothing to do for good, so that a repeated trigger (a
	// redelivery, a replay, a cron tick on every replica) is answered at
	// the rate the kind's store answers one read, without queueing on the
	// lock behind the other repeats (a bill run of a COMPLETED period). It
	// returns a *CompletedError naming the run that completed the work,
	// with its counts: outcome already_completed, run.already_completed
	// with data.before_lock, nothing acquired. nil, nil when it cannot
	// tell; an error is logged. Either way the run goes the locked way
	// (acquire, Claim), which is the authority. run holds no lease: its
	// events carry no lock fence. Requires Claim.
	//
	// Only for work whose completion is final (nothing the coordinator
	// does undoes it), so that the answer read without the lock is the one
	// Claim would give under it at that instant.
	AlreadyCompleted func(ctx context.Context, run *Run, p P) (*CompletedError, error)

	// Schedule is a robfig/cron spec (internal/cronspec): every replica
	// ticks, the lock decides which one works. Empty: not scheduled. Tick
	// gives the P of a tick at at, in the schedule's time zone; required
	// with a Schedule.
	Schedule string
	Tick     func(at time.Time) (P, error)

	// Status reports a run's state for GET HTTPPath/{id} (with
	// Def.StatusID): a JSON-encodable state, ErrNotFound, or an error
	// wrapping job.ErrBadInput for an id that can never exist.
	Status func(ctx context.Context, id string) (any, error)

	// Observe keeps metrics of the kind's own outcomes (the series that
	// predate the template). Called once per run.
	Observe func(res job.Result)

	// Incomplete makes the kind resumable: every replica's resumer asks it,
	// every ResumeInterval, for the runs its store knows to be accepted and
	// not complete, and runs them again through the template (lock, claim,
	// the kind's own resume) with trigger source job.SourceResume. The
	// template also records, in run_requests, the requests of its runs that
	// did not complete (lost, a retryable failure, already_owned), so a
	// Kafka trigger is committed only once the resumer owes its run. A run
	// in progress may be listed: the resumer finds its lock held.
	Incomplete func(ctx context.Context) ([]Incomplete[P], error)

	// Completions, when set, makes a run's run.completed at least once
	// across a crash of its replica (see Completions).
	Completions *Completions[P]
}

// Deps are what Open may use. Nothing in them is contacted by Open itself.
type Deps struct {
	// DB is the Postgres pool. Nil where only triggers are decoded.
	DB *pgxpool.Pool
	// Locker is the process's lock port, for library code a kind calls that
	// takes its lock itself (reentrantly, under the run's context).
	Locker ownership.Locker
	// Log gets the kind's log lines. Never nil in Open.
	Log *slog.Logger
	// Registerer gets the kind's own metrics. Nil: not registered.
	Registerer prometheus.Registerer
}

// Spec is what a kind is called and where its triggers arrive.
type Spec struct {
	// Name is the kind's entry in the registry: the job name in results,
	// events and metrics, and the namespace of its lock keys
	// ("billrun" owns "billrun:2026-11"). Lower case, digits and '-'.
	Name string
	// Command is the word after `coordinator run` and `coordinator
	// trigger` ("reaper"). Default Name.
	Command string
	// Summary is one line of help: what a run does.
	Summary string
	// Usage shows the kind's own arguments in help ("--period YYYY-MM").
	Usage string
	// Topic is the Kafka trigger topic, its contract name before the
	// deployment's prefix. Empty: no Kafka trigger.
	Topic string
	// HTTPPath is where POST starts a run ("/v1/billruns"). Empty: no HTTP
	// trigger.
	HTTPPath string
	// HTTPAsync answers POST with 202 as soon as the run is owned (and
	// claimed, for a kind with a Claim) and lets it go on in the
	// background; otherwise the call waits for the outcome.
	HTTPAsync bool
}

// Report is what a run did.
type Report struct {
	// Counts go into Result.Counts and the data of run.completed,
	// run.failed and ownership.lost.
	Counts map[string]int64
	// Data are further fields of that event (a stop reason, say).
	Data map[string]any
}

// Lease is how a run holds its lock (ADR-024 decision 3, docs/adr/024-distributed-lock-strategy.md).
type Lease struct {
	// TTL 0 is a watchdog-managed lease (renewed while the process lives);
	// TTL > 0 is an explicit lease that hard-expires.
	TTL time.Duration
	// MinHold keeps the lock at least this long after it was taken, even
	// when the run ends sooner (ShedLock's lockAtLeastFor): the template
	// releases it by timer at acquired + MinHold, so a replica whose
	// trigger comes a little later finds it held. An explicit lease is
	// lengthened to outlive the hold.
	MinHold time.Duration
}

// Incomplete is one run a Worker's Incomplete lists.
type Incomplete[P any] struct {
	// Params are the run's parameters (Encode must handle them).
	Params P
	// Trigger is the request the kind's store names (request id,
	// requester, source), for correlation; it may be empty.
	Trigger job.Trigger
	// Since is when the run was accepted, as the store knows it (zero:
	// now).
	Since time.Time
	// State is the store's word for it (RUNNING, INTERRUPTED, FAILED).
	State string
}

// Completions is a Worker whose store records, besides that a run
// completed, whether its run.completed was acknowledged by the events topic
// (a bill run: bill_runs.completed_event_at), so that the event is at least
// once across a crash of its replica: the Worker stores, with the
// completion, the id the template will give the run's run.completed
// (Run.CompletionEventID, random per run); the template marks it published
// once the sink acknowledged that event; every replica's resumer
// re-publishes, with the stored id, the completions left unmarked for
// RepublishAfter (the owner was SIGKILLed with the event in its buffer, or
// the buffer overflowed). Consumers drop the duplicates by id. All three
// functions are required.
type Completions[P any] struct {
	// Records says whether the completion of a run with p is recorded (a
	// bill run's is; an adjustment run's is not: its run.completed stays
	// at most once, with a random id).
	Records func(p P) bool
	// Published marks the completion of p under claim fence as
	// acknowledged. Called only after the sink acknowledged its
	// run.completed; marking twice is harmless.
	Published func(ctx context.Context, p P, fence int64) error
	// Unpublished lists at most limit completions not marked published
	// that ended more than olderThan ago, oldest first; only those whose
	// run.completed id the store kept.
	Unpublished func(ctx context.Context, olderThan time.Duration, limit int) ([]Completion[P], error)
}

// Completion is one completed run whose run.completed is not known to be
// published.
type Completion[P any] struct {
	// Params are the run's parameters (LockKey must handle them).
	Params P
	// EventID is the id of the run's run.completed (Run.CompletionEventID),
	// as the store kept it: a re-publication repeats it.
	EventID string
	// Owner is the replica that completed it; Fence its claim fence,
	// LockFence its lock's fencing token.
	Owner            string
	Fence, LockFence int64
	// Trigger is the completed run's request, as the store recorded it.
	Trigger job.Trigger
	// Counts are the totals the store kept (the event's data).
	Counts map[string]int64
	// Finished is when the run completed.
	Finished time.Time
}

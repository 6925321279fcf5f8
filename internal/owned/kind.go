package owned

import (
	"context"
	"flag"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/telemetry"
)

// Params are one run's parameters, as a kind decoded them (a bill run's
// period, a replenishment's numbers). Transport never looks inside: it hands
// them from the kind's Decode or Flags to the kind's LockKey and Run.
type Params any

// Kind is a kind of owned run as every transport sees it: what it is called,
// where its triggers come from and how a trigger becomes Params. It holds no
// connection; Open gives the Worker that runs it in one deployment.
//
// A kind is one package with one Kind value, listed once in internal/kinds.
type Kind interface {
	// Spec names the kind and its trigger endpoints.
	Spec() Spec
	// Decode turns a trigger's JSON fields (a Kafka record, an HTTP body)
	// into Params. Input that can never be run is a *RejectError: a Kafka
	// record goes to the dead-letter topic with its Reason, an HTTP call
	// gets 400 with its Detail.
	Decode(in Input) (Params, error)
	// Encode is Decode's inverse: the Kafka record key and the JSON fields
	// of a trigger asking for p (`coordinator trigger`). key may be nil.
	Encode(p Params) (key []byte, fields map[string]any)
	// Flags adds the kind's flags to fs (`coordinator run` and `trigger`)
	// and returns what builds Params once fs is parsed; args are the
	// positional arguments left. Bad values are errors wrapping
	// job.ErrBadInput (exit 64).
	Flags(fs *flag.FlagSet) func(args []string) (Params, error)
	// LockKey is the ownership key of a run with p. It is Spec().Name, a
	// colon, and the rest: a kind owns its name's lock-key namespace.
	LockKey(p Params) string
	// Open builds the kind's Worker from the deployment's dependencies. It
	// contacts nothing; a bad configuration is an error naming the field.
	Open(d Deps) (Worker, error)
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
	// claimed, for a Claimer) and lets it go on in the background; otherwise
	// the call waits for the outcome.
	HTTPAsync bool
}

// Deps are what Open may use. Nothing in them is contacted by Open itself.
type Deps struct {
	// Config is the deployment's configuration.
	Config config.Config
	// DB is the Postgres pool. Nil where only triggers are decoded (the CLI
	// `trigger` command never opens a kind).
	DB *pgxpool.Pool
	// Locker is the process's lock port, for library code a kind calls that
	// takes its lock itself (reentrantly, under the run's context).
	Locker ownership.Locker
	// Log gets the kind's log lines.
	Log *slog.Logger
	// Registerer gets the kind's own metrics. Nil: not registered.
	Registerer prometheus.Registerer
	// Telemetry traces runs (the template's spans and the kinds'). Nil:
	// tracing off.
	Telemetry *telemetry.Provider
	// Progress shows runs' progress. Nil: ProgressLog with
	// Config.ProgressInterval (DefaultProgressInterval when zero).
	Progress ProgressReporter
	// History keeps a record of every run that held its lock (the
	// console's run history). Nil: none kept.
	History RunHistory
}

// Worker runs a kind's owned work in one deployment.
type Worker interface {
	// Run does the work while the template holds the lock (and the claim).
	// ctx is cancelled when the lease is lost or the caller shuts down
	// (context.Cause is ErrShutdown then); stop at the next checkpoint.
	//
	// The Report goes into the result and the run's last event whatever the
	// error. A nil error is outcome completed; an error matching ErrLost is
	// lost (exit 76, not committed: a redelivery resumes); an error caused
	// by a lost lease or shutdown is lost too; any other error is failed.
	Run(ctx context.Context, run *Run, p Params) (Report, error)
}

// Report is what a run did.
type Report struct {
	// Counts go into Result.Counts and the data of run.completed,
	// run.failed and ownership.lost.
	Counts map[string]int64
	// Data are further fields of that event (a stop reason, say).
	Data map[string]any
}

// Leaser is a Worker that says how its lock is held. Without it the lease
// is watchdog-managed and released at once.
type Leaser interface {
	Lease(p Params) Lease
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

// Claimer is a Worker whose runs take a claim in their own store before the
// work, under the lock (a bill run's fenced bill_runs row). The template
// calls Claim once the lock is held and before Run.
type Claimer interface {
	// Claim returns the claim's fence: every event after it carries that
	// fence (data.lock_fence keeps the lock's). An error matching
	// ErrAlreadyCompleted (a *CompletedError) means there is nothing to do:
	// outcome already_completed, Run is not called. Other errors are
	// classified like Run's.
	Claim(ctx context.Context, run *Run, p Params) (fence int64, err error)
}

// CompletedChecker is a Worker that can tell, before the lock is taken,
// that a run's work is complete for good, so that a repeated trigger (a
// redelivery, a replay, a cron tick on every replica) is answered at the
// rate its store answers one read, without queueing on the lock behind
// the other repeats (a bill run of a COMPLETED period).
//
// Only for work whose completion is final: nothing the coordinator does
// undoes it, so the answer read without the lock is the one Claim would
// give under it at that instant. When in doubt the kind says nil, nil, and
// the run goes the locked way (acquire, Claim), which decides as ever.
type CompletedChecker interface {
	// AlreadyCompleted returns a *CompletedError naming the run that
	// completed the work, with its counts, when a run with p has nothing
	// to do; nil, nil when it cannot tell (then the lock is taken). An
	// error is logged and the lock is taken too: the locked way is the
	// authority. run has no lease: events it emits carry no fence.
	AlreadyCompleted(ctx context.Context, run *Run, p Params) (*CompletedError, error)
}

// Scheduler is a Worker that cron runs too. Every replica ticks; the lock
// decides which one works.
type Scheduler interface {
	// Schedule is the robfig/cron spec from the configuration; empty: not
	// scheduled.
	Schedule() string
	// Tick gives the Params of a tick at at, in the schedule's time zone.
	Tick(at time.Time) (Params, error)
}

// StatusKind is a Kind whose runs can be looked up by id: GET
// HTTPPath/{id} answers with the Worker's StatusReader.
type StatusKind interface {
	// StatusID is the id of the run p asks for (a bill run's period).
	StatusID(p Params) string
}

// StatusReader is a Worker that reports a run's state (GET HTTPPath/{id}).
type StatusReader interface {
	// Status returns a JSON-encodable state, ErrNotFound, or an error
	// wrapping job.ErrBadInput for an id that can never exist.
	Status(ctx context.Context, id string) (any, error)
}

// Observer is a Worker that keeps metrics of its own outcomes (the series
// that predate the template). The template calls it once per run.
type Observer interface {
	Observe(res job.Result)
}

// RecordKeyed is a Kind whose lock key can be read from a Kafka record key
// alone, so that a rejected record's trigger.rejected names the key.
// Without it, the event's subject is the kind's name.
type RecordKeyed interface {
	LockKeyOfRecord(recordKey []byte) (string, bool)
}

// Resumable is a Worker whose runs are finished by the resumer when they
// did not complete: every replica asks it, every ResumeInterval, for the
// runs its store knows to be accepted and not complete, and runs them again
// through the template (lock, claim, the kind's own resume) with trigger
// source job.SourceResume. The template also records, in run_requests, the
// requests of its runs that did not complete (lost, a retryable failure,
// already_owned), so a Kafka trigger is committed only once the resumer owes
// its run. One method is all a kind adds to be resumed.
type Resumable interface {
	// Incomplete lists the runs accepted and not complete that another run
	// would finish (a bill run: its bill_runs rows that are not COMPLETED).
	// A run in progress may be listed: the resumer finds its lock held.
	Incomplete(ctx context.Context) ([]Incomplete, error)
}

// Incomplete is one run a Resumable lists.
type Incomplete struct {
	// Params are the run's parameters (Encode must handle them).
	Params Params
	// Trigger is the request the kind's store names (request id,
	// requester, source), for correlation; it may be empty.
	Trigger job.Trigger
	// Since is when the run was accepted, as the store knows it (zero:
	// now).
	Since time.Time
	// State is the store's word for it (RUNNING, INTERRUPTED, FAILED).
	State string
}

// CompletionRecorder is a Worker whose store records, besides that a run
// completed, whether its run.completed was acknowledged by the events topic
// (a bill run: bill_runs.completed_event_at), so that the event is at least
// once across a crash of its replica: the Worker stores, with the
// completion, the id the template will give the run's run.completed
// (Run.CompletionEventID, random per run); the template marks it published
// once the sink acknowledged that event; every replica's resumer
// re-publishes, with the stored id, the completions left unmarked for
// RepublishAfter (the owner was SIGKILLed with the event in its buffer, or
// the buffer overflowed). Consumers drop the duplicates by id.
type CompletionRecorder interface {
	// RecordsCompletion says whether the completion of a run with p is
	// recorded (a bill run's is; an adjustment run's is not: its
	// run.completed stays at most once, with a random id).
	RecordsCompletion(p Params) bool
	// CompletionPublished marks the completion of p under claim fence as
	// acknowledged. Called only after the sink acknowledged its
	// run.completed; marking twice is harmless.
	CompletionPublished(ctx context.Context, p Params, fence int64) error
	// UnpublishedCompletions lists at most limit completions not marked
	// published that ended more than olderThan ago, oldest first; only those
	// whose run.completed id the store kept.
	UnpublishedCompletions(ctx context.Context, olderThan time.Duration, limit int) ([]Completion, error)
}

// Completion is one completed run whose run.completed is not known to be
// published.
type Completion struct {
	// Params are the run's parameters (LockKey must handle them).
	Params Params
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

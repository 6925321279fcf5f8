package owned

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// Runner is the one owned-run template: for every kind it takes the lock,
// claims where the kind has a claim, runs the kind's work under the lease,
// maps what happened to an outcome, emits the ownership events, releases,
// and records metrics. Kinds only do their work; transports only decode
// triggers and call Run (or Begin and Execute).
//
// Safe for concurrent use. One per process.
type Runner struct {
	reg     *Registry
	workers map[string]*worker
	locker  ownership.Locker
	emit    events.Emitter
	replica string
	log     *slog.Logger
	m       *metrics

	tracer   trace.Tracer // nil: tracing off
	progress ProgressReporter
	inFlight inFlight
	requests *requests // nil: no database, nothing recorded for the resumer
	holds    holds     // locks kept after their runs for a minimum hold
	history  RunHistory
}

// RunnerConfig configures the template of one process.
type RunnerConfig struct {
	// Deps are what every kind's Open gets; Deps.Locker is required.
	Deps
	// Replica is the id written into results and events
	// (COORDINATOR_REPLICA_ID). Default: the Locker's owner.
	Replica string
	// Emit gets every event. Default: none.
	Emit events.Emitter
	// Tracer traces runs (the template's spans and the kinds'). Nil:
	// tracing off.
	Tracer trace.Tracer
	// Progress shows runs' progress. Default ProgressLog(ProgressInterval).
	Progress ProgressReporter
	// ProgressInterval is how often ProgressLog logs a run in flight
	// (COORDINATOR_PROGRESS_INTERVAL). Default DefaultProgressInterval.
	ProgressInterval time.Duration
	// History keeps a record of every run that held its lock (the
	// console's run history). Nil: none kept.
	History RunHistory
}

// NewRunner opens every registered kind with cfg.Deps (nothing is
// contacted) and returns the template that runs them.
func NewRunner(reg *Registry, cfg RunnerConfig) (*Runner, error) {
	if reg == nil || cfg.Locker == nil {
		return nil, errors.New("owned: NewRunner needs a Registry and a Locker")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Emit == nil {
		cfg.Emit = events.Multi{}
	}
	r := &Runner{reg: reg, workers: map[string]*worker{}, locker: cfg.Locker, emit: cfg.Emit,
		log: cfg.Log, replica: cmp.Or(cfg.Replica, cfg.Locker.Owner()), progress: cfg.Progress, tracer: cfg.Tracer,
		history: cfg.History}
	if r.progress == nil {
		r.progress = ProgressLog(cmp.Or(cfg.ProgressInterval, DefaultProgressInterval))
	}
	if cfg.DB != nil {
		r.requests = &requests{pool: cfg.DB}
	}
	for _, k := range reg.Kinds() {
		w, err := k.open(cfg.Deps)
		if err != nil {
			return nil, fmt.Errorf("owned: open kind %q: %w", k.Spec().Name, err)
		}
		r.workers[k.Spec().Name] = w
	}
	var err error
	names := make([]string, 0, len(r.workers))
	for _, k := range reg.Kinds() {
		names = append(names, k.Spec().Name)
	}
	if r.m, err = newMetrics(cfg.Registerer, &r.inFlight, names); err != nil {
		return nil, err
	}
	return r, nil
}

// InFlight is the progress of the runs this Runner is executing now.
func (r *Runner) InFlight() []Progress { return r.inFlight.snapshot() }

// Close releases now the locks the Runner keeps after their runs for a
// minimum hold (Lease.MinHold), which their timers would release later. A
// process that exits calls it: its timers end with it, and the lock would
// stay held until its TTL, so that a rerun is told a process that is gone
// owns it (`coordinator run reaper` twice within the reaper's hold). The
// Runner still runs afterwards; later holds keep their timers.
func (r *Runner) Close() { r.holds.releaseAll() }

// Registry is the kinds this Runner runs.
func (r *Runner) Registry() *Registry { return r.reg }

// Replica is the id the Runner writes into results and events.
func (r *Runner) Replica() string { return r.replica }

// Schedule is one kind's cron schedule (Worker.Schedule).
type Schedule struct {
	Kind Kind
	// Spec is the robfig/cron spec.
	Spec string
	// Tick gives the Params of a tick at at, in the schedule's zone.
	Tick func(at time.Time) (Params, error)
}

// Schedules are the schedules of the kinds whose Worker has one, in
// registration order.
func (r *Runner) Schedules() []Schedule {
	var out []Schedule
	for _, k := range r.reg.Kinds() {
		if w := r.workers[k.Spec().Name]; w.schedule != "" {
			out = append(out, Schedule{Kind: k, Spec: w.schedule, Tick: w.tick})
		}
	}
	return out
}

// Status answers GET HTTPPath/{id} for k: ErrNotFound when k keeps no
// run state.
func (r *Runner) Status(ctx context.Context, k Kind, id string) (any, error) {
	w := r.workers[k.Spec().Name]
	if w == nil || w.status == nil {
		return nil, ErrNotFound
	}
	return w.status(ctx, id)
}

// Run is Begin and, when the run is owned, Execute: one owned run to its
// end, under ctx.
func (r *Runner) Run(ctx context.Context, k Kind, p Params, t job.Trigger) job.Result {
	o, res := r.Begin(ctx, k, p, t)
	if o == nil {
		return res
	}
	return o.Execute(ctx)
}

package trigger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
)

// ErrShuttingDown is returned for work offered after Shutdown began. The
// Result that comes with it has outcome unavailable, so a Kafka trigger is
// not committed and an HTTP caller gets 503.
var ErrShuttingDown = errors.New("trigger: dispatcher shutting down")

// DispatcherConfig configures the Dispatcher.
type DispatcherConfig struct {
	// Runner is the owned-run template with the replica's kinds. Required.
	Runner *owned.Runner
	// Log defaults to discard.
	Log *slog.Logger
	// Metrics may be nil.
	Metrics *Metrics
	// MaxRunsInFlight is the number of runs in flight (from any source) at
	// which an HTTP trigger is refused with a *job.CapacityError (HTTP 429)
	// instead of starting another run. Kafka and cron triggers are never
	// refused: the partitions and schedules bound them. 0: no cap.
	MaxRunsInFlight int
}

// Dispatcher turns triggers from every source (Kafka, cron, HTTP) into owned
// runs of any registered kind, through the template. One per replica. It
// tracks every run it starts, so Shutdown can let them finish within a
// bound and then cancel them: a cancelled run stops at its next checkpoint,
// releases its lock and ends lost, so its trigger is redelivered and
// resumed elsewhere.
type Dispatcher struct {
	runner  *owned.Runner
	log     *slog.Logger
	m       *Metrics
	maxRuns int

	runCtx     context.Context // cancelled when Shutdown's bound expires
	cancelRuns context.CancelFunc

	mu       sync.Mutex
	closed   bool
	inFlight int
	runs     sync.WaitGroup
	shutOnce sync.Once
}

// NewDispatcher builds the replica's dispatcher.
func NewDispatcher(cfg DispatcherConfig) *Dispatcher {
	if cfg.Runner == nil {
		panic("trigger: DispatcherConfig.Runner is required")
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Dispatcher{runner: cfg.Runner, log: log, m: cfg.Metrics, maxRuns: cfg.MaxRunsInFlight, runCtx: ctx, cancelRuns: cancel}
}

// Kinds are the kinds the dispatcher runs.
func (d *Dispatcher) Kinds() *owned.Registry { return d.runner.Registry() }

// begin registers one run of trigger t: ErrShuttingDown once Shutdown
// began, a *job.CapacityError for an HTTP trigger at the cap. Checking and
// counting under one lock makes the cap exact under concurrent requests.
func (d *Dispatcher) begin(t job.Trigger) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrShuttingDown
	}
	if d.maxRuns > 0 && t.Source == job.SourceHTTP && d.inFlight >= d.maxRuns {
		return &job.CapacityError{Limit: d.maxRuns, InFlight: d.inFlight}
	}
	d.inFlight++
	d.runs.Add(1)
	d.m.runs(1)
	return nil
}

func (d *Dispatcher) end() {
	d.mu.Lock()
	d.inFlight--
	d.mu.Unlock()
	d.m.runs(-1)
	d.runs.Done()
}

// InFlight is the number of runs in flight now.
func (d *Dispatcher) InFlight() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.inFlight
}

// runContext is ctx, also cancelled when Shutdown's bound expires.
func (d *Dispatcher) runContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(d.runCtx, cancel)
	return ctx, func() { stop(); cancel() }
}

// refused is the Result of work refused by begin: outcome unavailable
// (nothing ran; a Kafka trigger is not committed).
func (d *Dispatcher) refused(k owned.Kind, p owned.Params, t job.Trigger, err error) job.Result {
	return job.Result{Job: k.Spec().Name, Key: k.LockKey(p), Outcome: job.OutcomeUnavailable, Replica: d.runner.Replica(),
		RequestID: t.RequestID, Error: err.Error()}
}

// Run runs one owned run of k to its end under ctx (the Kafka consumer,
// cron, synchronous HTTP). The error is ErrShuttingDown, a
// *job.CapacityError (HTTP only), or nil.
func (d *Dispatcher) Run(ctx context.Context, k owned.Kind, p owned.Params, t job.Trigger) (job.Result, error) {
	if err := d.begin(t); err != nil {
		d.refusal(k, t, err)
		return d.refused(k, p, t, err), err
	}
	defer d.end()
	ctx, cancel := d.runContext(ctx)
	defer cancel()
	res := d.runner.Run(ctx, k, p, t)
	d.finished(ctx, t, res)
	return res, nil
}

// Start takes the lock (and the claim) synchronously under ctx. When the
// run is owned it goes on in a background goroutine the Dispatcher tracks
// (detached from ctx, so an HTTP request ending does not stop it) and Start
// returns started=true with the owner and fence and no outcome yet.
// Otherwise it returns the final Result (already_owned, unavailable,
// already_completed, failed) and started=false. The error is that of Run.
func (d *Dispatcher) Start(ctx context.Context, k owned.Kind, p owned.Params, t job.Trigger) (job.Result, bool, error) {
	if err := d.begin(t); err != nil {
		d.refusal(k, t, err)
		return d.refused(k, p, t, err), false, err
	}
	beginCtx, cancelBegin := d.runContext(ctx)
	o, res := d.runner.Begin(beginCtx, k, p, t)
	cancelBegin()
	if o == nil {
		d.finished(ctx, t, res)
		d.end()
		return res, false, nil
	}
	runCtx, cancel := d.runContext(context.WithoutCancel(ctx))
	go func() {
		defer d.end()
		defer cancel()
		d.finished(runCtx, t, o.Execute(runCtx))
	}()
	return res, true, nil
}

// Status answers GET HTTPPath/{id} for k (owned.ErrNotFound when k keeps
// no run state).
func (d *Dispatcher) Status(ctx context.Context, k owned.Kind, id string) (any, error) {
	return d.runner.Status(ctx, k, id)
}

// refusal logs work refused before it began (at capacity; shutting down is
// logged once by the replica).
func (d *Dispatcher) refusal(k owned.Kind, t job.Trigger, err error) {
	var ce *job.CapacityError
	if errors.As(err, &ce) {
		d.log.Warn("trigger_refused_at_capacity", "job", k.Spec().Name, "trigger", string(t.Source),
			"request_id", t.RequestID, "in_flight", ce.InFlight, "max_runs_in_flight", ce.Limit)
	}
}

// finished logs the run's end; ctx carries the trigger's trace context, so
// the line has the run's trace_id like every other line of the run.
func (d *Dispatcher) finished(ctx context.Context, t job.Trigger, res job.Result) {
	d.m.outcome(t.Source, res.Job, res.Outcome)
	level := slog.LevelInfo
	if !res.Handled() || res.Outcome == job.OutcomeFailed || res.Outcome == job.OutcomeLost {
		level = slog.LevelWarn
	}
	args := []any{"job", res.Job, "lock_key", res.Key,
		"outcome", string(res.Outcome), "trigger", string(t.Source), "request_id", t.RequestID,
		"owner", res.Owner, "fence", res.Fence, "deferred", res.Deferred, "duration_ms", res.DurationMS, "error", res.Error}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		args = append(args, "trace_id", sc.TraceID().String())
	}
	d.log.Log(context.Background(), level, "trigger_dispatched", args...)
}

// Shutdown stops accepting work and waits for the runs in flight. When ctx
// ends first, it cancels them (they end lost and release their locks) and
// waits for them to return. Safe to call twice; every call waits.
func (d *Dispatcher) Shutdown(ctx context.Context) {
	d.shutOnce.Do(func() {
		d.mu.Lock()
		d.closed = true
		d.mu.Unlock()
	})
	done := make(chan struct{})
	go func() {
		d.runs.Wait()
		close(done)
	}()
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	d.log.Warn("dispatcher_shutdown_cancelling_runs", "reason", context.Cause(ctx))
	d.cancelRuns()
	<-done
}

// CronJobs are the schedules of every kind whose Worker has one
// (owned.Worker.Schedule). A tick's params are the kind's Tick at the
// tick's scheduled time (a catch-up's is the missed tick's). A tick's work
// runs detached from the cron's own cancellation: shutdown gives it the
// dispatcher's bound (COORDINATOR_SHUTDOWN_TIMEOUT) to finish. A tick whose
// result is not finished with (job.Result.Handled: not completed, not
// failed for good, not recorded for the resumer) returns a
// *TickNotDurableError, and the cron runs it again.
func (d *Dispatcher) CronJobs() []CronJob {
	var jobs []CronJob
	for _, s := range d.runner.Schedules() {
		k, name, spec := s.Kind, s.Kind.Spec().Name, s.Spec
		loc := ScheduleLocation(spec)
		key := func(at time.Time) (string, error) {
			p, err := s.Tick(at.In(loc))
			if err != nil {
				return "", err
			}
			return k.LockKey(p), nil
		}
		jobs = append(jobs, CronJob{Name: name, Spec: spec, Key: key, Run: func(ctx context.Context, t job.Trigger, at time.Time) error {
			p, err := s.Tick(at.In(loc))
			if err != nil { // the kind's own configuration: trying again changes nothing
				d.log.Error("cron_tick_failed", "job", name, "request_id", t.RequestID, "error", err)
				return nil
			}
			res, err := d.Run(context.WithoutCancel(ctx), k, p, t)
			switch {
			case err != nil:
				return err
			case !res.Handled():
				return &TickNotDurableError{Result: res}
			}
			return nil
		}})
	}
	return jobs
}

// TickNotDurableError is a cron tick whose run neither finished nor was
// recorded for the resumer: lost or failed transiently with its request
// unrecorded (Postgres down), the lock backend unavailable for a kind
// without a resumer, and the like. The cron runs the tick again.
type TickNotDurableError struct {
	Result job.Result
}

func (e *TickNotDurableError) Error() string {
	msg := fmt.Sprintf("%s ended %s and is not recorded for the resumer", e.Result.Key, e.Result.Outcome)
	if e.Result.Error != "" {
		msg += ": " + e.Result.Error
	}
	return msg
}

package trigger

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/msisdnreaper"
)

// ErrShuttingDown is returned for work offered after Shutdown began. The
// Result that comes with it has outcome unavailable, so a Kafka trigger is
// not committed and an HTTP caller gets 503.
var ErrShuttingDown = errors.New("trigger: dispatcher shutting down")

// DispatcherConfig configures the Dispatcher.
type DispatcherConfig struct {
	// BillRuns runs bill runs. Required for BillRun and StartBillRun.
	BillRuns *billrun.Runner
	// Sweeper runs reaper sweeps. Required for Sweep.
	Sweeper *msisdnreaper.Sweeper
	// Log defaults to discard.
	Log *slog.Logger
	// Metrics may be nil.
	Metrics *Metrics
	// Replica fills Result.Replica of results the dispatcher makes itself
	// (refusals during shutdown). Optional.
	Replica string
}

// executor is the claimed half of a two-phase bill run (*billrun.Claimed).
type executor interface {
	Execute(ctx context.Context) job.Result
}

// Dispatcher turns triggers from every source (Kafka, cron, HTTP) into owned
// runs. One per replica. It tracks every run it starts, so Shutdown can let
// them finish within a bound and then cancel them: a cancelled bill run stops
// at its next batch boundary, marks itself INTERRUPTED, releases its lock and
// ends lost, so its trigger is redelivered and resumed elsewhere.
type Dispatcher struct {
	claim   func(ctx context.Context, p billrun.Period, t job.Trigger) (executor, job.Result)
	sweep   func(ctx context.Context, t job.Trigger) job.Result
	log     *slog.Logger
	m       *Metrics
	replica string

	runCtx     context.Context // cancelled when Shutdown's bound expires
	cancelRuns context.CancelFunc

	mu       sync.Mutex
	closed   bool
	runs     sync.WaitGroup
	shutOnce sync.Once
}

// NewDispatcher builds the replica's dispatcher.
func NewDispatcher(cfg DispatcherConfig) *Dispatcher {
	d := newDispatcher(cfg.Log, cfg.Metrics)
	d.replica = cfg.Replica
	if r := cfg.BillRuns; r != nil {
		d.claim = func(ctx context.Context, p billrun.Period, t job.Trigger) (executor, job.Result) {
			c, res := r.Claim(ctx, p, t)
			if c == nil {
				return nil, res
			}
			return c, res
		}
	}
	if s := cfg.Sweeper; s != nil {
		d.sweep = s.Sweep
	}
	return d
}

func newDispatcher(log *slog.Logger, m *Metrics) *Dispatcher {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Dispatcher{log: log, m: m, runCtx: ctx, cancelRuns: cancel}
}

// begin registers one run; false once Shutdown began.
func (d *Dispatcher) begin() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	d.runs.Add(1)
	d.m.runs(1)
	return true
}

func (d *Dispatcher) end() {
	d.m.runs(-1)
	d.runs.Done()
}

// runContext is ctx, also cancelled when Shutdown's bound expires.
func (d *Dispatcher) runContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(d.runCtx, cancel)
	return ctx, func() { stop(); cancel() }
}

func (d *Dispatcher) billRunResult(period string, t job.Trigger, o job.Outcome, msg string) job.Result {
	key := billrun.JobName + ":" + period
	if p, err := billrun.ParsePeriod(period); err == nil {
		key = billrun.LockKey(p)
	}
	return job.Result{Job: billrun.JobName, Key: key, Outcome: o, Replica: d.replica, RequestID: t.RequestID, Error: msg}
}

// BillRun validates the period (a bad one returns an error wrapping
// job.ErrBadInput, and nothing runs) and runs the bill run to its end under
// ctx. The Kafka consumer and cron use it.
func (d *Dispatcher) BillRun(ctx context.Context, period string, t job.Trigger) (job.Result, error) {
	p, err := billrun.ParsePeriod(period)
	if err != nil {
		return d.billRunResult(period, t, job.OutcomeFailed, err.Error()), err
	}
	if d.claim == nil {
		return d.billRunResult(period, t, job.OutcomeFailed, "no bill-run runner configured"), errors.New("trigger: dispatcher has no bill-run runner")
	}
	if !d.begin() {
		return d.billRunResult(period, t, job.OutcomeUnavailable, ErrShuttingDown.Error()), ErrShuttingDown
	}
	defer d.end()
	ctx, cancel := d.runContext(ctx)
	defer cancel()
	c, res := d.claim(ctx, p, t)
	if c != nil {
		res = c.Execute(ctx)
	}
	d.finished(t, res)
	return res, nil
}

// StartBillRun claims synchronously under ctx. When the claim succeeds it
// runs Execute in a background goroutine the Dispatcher tracks (detached from
// ctx, so an HTTP request ending does not stop the run) and returns
// started=true with the claim's Result (owner, fence, no outcome yet).
// Otherwise it returns the final Result (already_owned, unavailable,
// already_completed, failed) and started=false.
func (d *Dispatcher) StartBillRun(ctx context.Context, period string, t job.Trigger) (job.Result, bool, error) {
	p, err := billrun.ParsePeriod(period)
	if err != nil {
		return d.billRunResult(period, t, job.OutcomeFailed, err.Error()), false, err
	}
	if d.claim == nil {
		return d.billRunResult(period, t, job.OutcomeFailed, "no bill-run runner configured"), false, errors.New("trigger: dispatcher has no bill-run runner")
	}
	if !d.begin() {
		return d.billRunResult(period, t, job.OutcomeUnavailable, ErrShuttingDown.Error()), false, ErrShuttingDown
	}
	claimCtx, cancelClaim := d.runContext(ctx)
	c, res := d.claim(claimCtx, p, t)
	cancelClaim()
	if c == nil {
		d.finished(t, res)
		d.end()
		return res, false, nil
	}
	runCtx, cancel := d.runContext(context.WithoutCancel(ctx))
	go func() {
		defer d.end()
		defer cancel()
		d.finished(t, c.Execute(runCtx))
	}()
	return res, true, nil
}

// Sweep runs one reaper sweep to its end.
func (d *Dispatcher) Sweep(ctx context.Context, t job.Trigger) job.Result {
	if d.sweep == nil {
		return job.Result{Job: msisdnreaper.JobName, Key: msisdnreaper.SweepKey, Outcome: job.OutcomeFailed,
			Replica: d.replica, RequestID: t.RequestID, Error: "no sweeper configured"}
	}
	if !d.begin() {
		return job.Result{Job: msisdnreaper.JobName, Key: msisdnreaper.SweepKey, Outcome: job.OutcomeUnavailable,
			Replica: d.replica, RequestID: t.RequestID, Error: ErrShuttingDown.Error()}
	}
	defer d.end()
	ctx, cancel := d.runContext(ctx)
	defer cancel()
	res := d.sweep(ctx, t)
	d.finished(t, res)
	return res
}

func (d *Dispatcher) finished(t job.Trigger, res job.Result) {
	d.m.outcome(t.Source, res.Job, res.Outcome)
	level := slog.LevelInfo
	if !res.Outcome.Handled() || res.Outcome == job.OutcomeFailed {
		level = slog.LevelWarn
	}
	d.log.Log(context.Background(), level, "trigger_dispatched", "job", res.Job, "lock_key", res.Key,
		"outcome", string(res.Outcome), "trigger", string(t.Source), "request_id", t.RequestID,
		"owner", res.Owner, "fence", res.Fence, "duration", time.Duration(res.DurationMS)*time.Millisecond, "err", res.Error)
}

// Shutdown stops accepting work and waits for the runs in flight. When ctx
// ends first, it cancels them (bill runs end INTERRUPTED/lost and release
// their locks) and waits for them to return. Safe to call twice; every call
// waits.
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

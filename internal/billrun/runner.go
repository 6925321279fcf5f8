package billrun

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/postgres"
)

// Config tunes a Runner. Zero fields take the defaults named on each.
type Config struct {
	// ReplicaID is written into bill_runs.owner and every event. Default:
	// the Locker's Owner().
	ReplicaID string
	// BatchSize is ACTIVE subscribers per batch transaction. Default 1000.
	BatchSize int
	// Workers is how many batch transactions run at once. Default 4. The
	// pool needs Workers+1 connections (the planner takes one briefly).
	Workers int
	// MaxBatchAttempts bounds the tries of one batch that meets transient
	// errors (lost connection, admin shutdown, serialization failure) or an
	// escaped unique violation. Default 5.
	MaxBatchAttempts int
	// RetryBackoff is the delay before a batch's second try; it doubles per
	// try, capped at 32x. Default 200ms.
	RetryBackoff time.Duration
	// IdleInTransactionTimeout bounds how long a batch transaction may sit
	// idle holding the bill_runs row FOR SHARE (a paused process): after it,
	// Postgres ends the session, so a new owner's claim is not blocked for
	// longer. Default 10s.
	IdleInTransactionTimeout time.Duration
	// ConflictSample is the most subscriber ids a billrun.invoice_conflict
	// event lists. Default 20.
	ConflictSample int
	// Logger gets the run's log lines. Default: discard.
	Logger *slog.Logger
	// Metrics records the coordinator_billrun_ series. nil: none.
	Metrics *Metrics

	// BeforeBatch is a test hook (nil in production): it runs in the worker
	// before each batch transaction starts, under the run's context. An error
	// that is not the context's fails the run.
	BeforeBatch func(ctx context.Context, firstID, lastID int64) error
}

func (c Config) withDefaults(owner string) Config {
	c.ReplicaID = cmp.Or(c.ReplicaID, owner)
	c.BatchSize = cmp.Or(c.BatchSize, 1000)
	c.Workers = cmp.Or(c.Workers, 4)
	c.MaxBatchAttempts = cmp.Or(c.MaxBatchAttempts, 5)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, 200*time.Millisecond)
	c.IdleInTransactionTimeout = cmp.Or(c.IdleInTransactionTimeout, 10*time.Second)
	c.ConflictSample = cmp.Or(c.ConflictSample, 20)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Runner runs bill runs: one owner per period, fenced batch transactions,
// resume from committed batches. Safe for concurrent use; each run is one
// Claim followed by one Execute.
type Runner struct {
	pool   *pgxpool.Pool
	locker ownership.Locker
	emit   events.Emitter
	cfg    Config
	log    *slog.Logger
}

// New returns a Runner. Defaults fill zero Config fields; negative sizes are
// raised to 1.
func New(pool *pgxpool.Pool, locker ownership.Locker, emit events.Emitter, cfg Config) *Runner {
	cfg = cfg.withDefaults(locker.Owner())
	cfg.BatchSize = max(cfg.BatchSize, 1)
	cfg.Workers = max(cfg.Workers, 1)
	cfg.MaxBatchAttempts = max(cfg.MaxBatchAttempts, 1)
	if emit == nil {
		emit = events.EmitterFunc(func(context.Context, events.Event) {})
	}
	return &Runner{pool: pool, locker: locker, emit: emit, cfg: cfg, log: cfg.Logger.With("job", JobName)}
}

// Counts keys of a bill run's Result.
const (
	CountSubscribers      = "subscribers"       // ACTIVE subscribers in the batches this run committed
	CountInvoicesCreated  = "invoices_created"  // invoices this run inserted
	CountAlreadyInvoiced  = "already_invoiced"  // subscribers this run found already invoiced for the period
	CountBatchesTotal     = "batches_total"     // skipped + planned by this run
	CountBatchesSkipped   = "batches_skipped"   // committed by earlier runs of the period (resume)
	CountBatchesCommitted = "batches_committed" // committed by this run
	CountBatchesRetried   = "batches_retried"   // batch tries that failed and were tried again
	CountUniqueViolations = "unique_violations" // 23505 errors that escaped ON CONFLICT
	// Period totals over every run of the period, read from bill_runs at the end.
	CountPeriodBatches         = "period_batches"
	CountPeriodSubscribers     = "period_subscribers"
	CountPeriodInvoicesCreated = "period_invoices_created"
	CountPeriodAlreadyInvoiced = "period_already_invoiced"
)

// Lost reasons, in the data of ownership.lost.
const (
	ReasonLeaseLost = "lease_lost" // the Redis lease ended (renewal failed or found the lock gone)
	ReasonFenceLost = "fence_lost" // a newer claim took the bill_runs row
	ReasonShutdown  = "shutdown"   // Execute's context was cancelled
)

var (
	// errFenceLost: a batch found the claim fence no longer ours.
	errFenceLost = errors.New("billrun: claim fence superseded")
	// errShutdown is the cause when Execute's ctx is cancelled.
	errShutdown = errors.New("billrun: shutdown")
)

// batchError is a batch that could not commit: the run fails.
type batchError struct {
	first, last int64
	attempts    int
	err         error
}

func (e *batchError) Error() string {
	msg := fmt.Sprintf("batch [%d,%d] failed after %d attempt(s)", e.first, e.last, e.attempts)
	if postgres.IsUniqueViolation(e.err) {
		msg += fmt.Sprintf(": unique violation (SQLSTATE 23505) on %s", cmp.Or(postgres.ConstraintName(e.err), "unknown constraint"))
	}
	return msg + ": " + e.err.Error()
}

func (e *batchError) Unwrap() error { return e.err }

// finishTimeout bounds ending a run (marking it COMPLETED, FAILED or
// INTERRUPTED), retries included.
const finishTimeout = 15 * time.Second

// Claimed is a period this replica owns and has claimed in Postgres. Call
// Execute exactly once.
type Claimed struct {
	r         *Runner
	period    Period
	trigger   job.Trigger
	lease     ownership.Lease
	fence     int64
	start     time.Time
	log       *slog.Logger
	executed  atomic.Bool
	result    job.Result
	lockFence int64
}

// Period is the claimed period.
func (c *Claimed) Period() Period { return c.period }

// Fence is the bill_runs claim fence every batch of this run proves.
func (c *Claimed) Fence() int64 { return c.fence }

// LockFence is the Redis lease's fencing token.
func (c *Claimed) LockFence() int64 { return c.lockFence }

// Run is Claim then, when claimed, Execute.
func (r *Runner) Run(ctx context.Context, p Period, t job.Trigger) job.Result {
	c, res := r.Claim(ctx, p, t)
	if c == nil {
		return res
	}
	return c.Execute(ctx)
}

func (r *Runner) event(typ events.Type, p Period, t job.Trigger, fence int64, extra map[string]any) events.Event {
	return events.Event{
		Type: typ, Key: LockKey(p), Job: JobName, Replica: r.cfg.ReplicaID,
		Trigger: string(t.Source), RequestID: t.RequestID, Fence: fence, Extra: extra,
	}
}

func (r *Runner) send(ctx context.Context, e events.Event) {
	r.emit.Emit(context.WithoutCancel(ctx), e)
}

// Claim acquires billrun:P (watchdog lease) and claims the period's bill_runs
// row. A nil *Claimed means the returned Result is final (already_owned with
// Owner, unavailable, already_completed, failed) and its events were
// emitted. Otherwise the Result describes the claim (Owner, Fence) with no
// Outcome yet, and the caller must call Execute.
func (r *Runner) Claim(ctx context.Context, p Period, t job.Trigger) (*Claimed, job.Result) {
	start := time.Now()
	key := LockKey(p)
	res := job.Result{Job: JobName, Key: key, Replica: r.cfg.ReplicaID, RequestID: t.RequestID}
	log := r.log.With("lock_key", key, "period", p.String(), "request_id", t.RequestID)
	final := func(o job.Outcome) (*Claimed, job.Result) {
		res.Outcome = o
		res.DurationMS = time.Since(start).Milliseconds()
		r.cfg.Metrics.outcome(o)
		return nil, res
	}
	if !p.Valid() {
		res.Error = job.BadInput("period %q is outside %d-01..%d-12", p.String(), MinYear, MaxYear).Error()
		return final(job.OutcomeFailed)
	}

	lease, err := r.locker.Acquire(ctx, key, 0)
	if err != nil {
		var ae *ownership.AcquireError
		errors.As(err, &ae)
		res.Error = err.Error()
		if errors.Is(err, ownership.ErrAlreadyOwned) {
			if ae != nil {
				res.Owner = ae.Owner
			}
			e := r.event(events.OwnershipAlreadyOwned, p, t, 0, map[string]any{"code": ownership.CodeLockAcquisitionFailed, "reason": string(ownership.ReasonAlreadyOwned)})
			e.Owner = res.Owner
			r.send(ctx, e)
			log.Info("billrun_already_owned", "owner", res.Owner)
			return final(job.OutcomeAlreadyOwned)
		}
		r.send(ctx, r.event(events.OwnershipUnavailable, p, t, 0, map[string]any{
			"code": ownership.CodeLockAcquisitionFailed, "reason": string(ownership.ReasonUnavailable), "error": err.Error(),
		}))
		log.Warn("billrun_lock_unavailable", "err", err)
		return final(job.OutcomeUnavailable)
	}
	log = log.With("lock_fence", lease.Fence())
	r.send(ctx, r.event(events.OwnershipAcquired, p, t, lease.Fence(), map[string]any{"lock_fence": lease.Fence()}))

	release := func() {
		relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ownership.ReleaseTimeout)
		defer cancel()
		if err := lease.Release(relCtx); err != nil {
			log.Warn("billrun_release_failed", "err", err)
			return
		}
		r.send(ctx, r.event(events.OwnershipReleased, p, t, lease.Fence(), map[string]any{"lock_fence": lease.Fence()}))
	}

	var fence int64
	err = r.pool.QueryRow(lease.Context(), sqlClaim, p.String(), r.cfg.ReplicaID, lease.Fence()).Scan(&fence)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		st, serr := r.Status(ctx, p)
		if serr != nil || st.Status != StatusCompleted {
			res.Error = fmt.Sprintf("billrun: claim found no claimable row and status read failed: %v", serr)
			r.send(ctx, r.event(events.RunFailed, p, t, 0, map[string]any{"error": res.Error}))
			release()
			return final(job.OutcomeFailed)
		}
		res.Owner, res.Fence = st.Owner, st.Fence
		res.Counts = map[string]int64{
			CountPeriodBatches:         st.Counts[CountBatchesCommitted],
			CountPeriodSubscribers:     st.Counts[CountSubscribers],
			CountPeriodInvoicesCreated: st.Counts[CountInvoicesCreated],
			CountPeriodAlreadyInvoiced: st.Counts[CountAlreadyInvoiced],
		}
		e := r.event(events.RunAlreadyCompleted, p, t, st.Fence, countsAny(res.Counts))
		e.Owner = st.Owner
		r.send(ctx, e)
		log.Info("billrun_already_completed", "owner", st.Owner, "fence", st.Fence)
		release()
		return final(job.OutcomeAlreadyCompleted)
	case err != nil:
		res.Error = fmt.Sprintf("billrun: claim %s: %v", p, err)
		r.send(ctx, r.event(events.RunFailed, p, t, 0, map[string]any{"error": res.Error, "lock_fence": lease.Fence()}))
		log.Error("billrun_claim_failed", "err", err)
		release()
		return final(job.OutcomeFailed)
	}

	res.Owner, res.Fence = r.cfg.ReplicaID, fence
	log.Info("billrun_claimed", "owner", r.cfg.ReplicaID, "fence", fence)
	c := &Claimed{r: r, period: p, trigger: t, lease: lease, fence: fence, lockFence: lease.Fence(), start: start,
		log: log.With("fence", fence), result: res}
	return c, res
}

// batchRange is one planned batch: the ACTIVE subscribers with ids in
// [first, last].
type batchRange struct {
	first, last int64
	n           int64
}

// runState aggregates a run's progress across workers.
type runState struct {
	mu               sync.Mutex
	committed        int64
	planned          int64
	retried          int64
	subscribers      int64
	created          int64
	already          int64
	uniqueViolations int64
	sample           []int64
	phase            map[string]time.Duration
}

func (s *runState) addPhase(name string, d time.Duration) {
	s.mu.Lock()
	s.phase[name] += d
	s.mu.Unlock()
}

// Execute runs the claimed period's batches, ends the run and releases the
// lock. ctx cancelled (shutdown) or the lease lost: no new batch starts,
// in-flight ones roll back, the run is marked INTERRUPTED while the fence is
// still ours, ownership.lost is emitted and the outcome is lost. A batch
// that keeps failing: the run is FAILED with last_error, run.failed, outcome
// failed. Otherwise COMPLETED, run.completed, outcome completed. Execute
// must be called exactly once; a second call returns a failed Result.
func (c *Claimed) Execute(ctx context.Context) job.Result {
	res := c.result
	if !c.executed.CompareAndSwap(false, true) {
		res.Outcome = job.OutcomeFailed
		res.Error = "billrun: Execute called twice"
		return res
	}
	r := c.r
	r.cfg.Metrics.running(1)
	defer r.cfg.Metrics.running(-1)

	parent := c.lease.Context()
	if sabotaged { // chaos_sabotage builds only (sabotage.go)
		parent = context.WithoutCancel(parent)
	}
	runCtx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	stopShutdown := context.AfterFunc(ctx, func() { cancel(errShutdown) })
	defer stopShutdown()

	st := &runState{phase: map[string]time.Duration{}}
	var ranges []batchRange
	err := c.retry(runCtx, "load_committed", func(ctx context.Context) error {
		var err error
		ranges, err = c.committedRanges(ctx)
		return err
	})
	if err != nil && runCtx.Err() == nil {
		cancel(err)
	}

	var (
		wg      sync.WaitGroup
		planned atomic.Bool // the planner walked every ACTIVE id
	)
	if runCtx.Err() == nil {
		batches := make(chan batchRange, r.cfg.Workers)
		wg.Go(func() {
			defer close(batches)
			err := c.plan(runCtx, ranges, batches, st)
			planned.Store(err == nil)
			if err != nil && runCtx.Err() == nil {
				cancel(fmt.Errorf("billrun: plan batches: %w", err))
			}
		})
		for range r.cfg.Workers {
			wg.Go(func() { c.work(runCtx, cancel, batches, st) })
		}
		wg.Wait()
	}

	skipped := int64(len(ranges))
	st.mu.Lock()
	res.Counts = map[string]int64{
		CountSubscribers:      st.subscribers,
		CountInvoicesCreated:  st.created,
		CountAlreadyInvoiced:  st.already,
		CountBatchesTotal:     skipped + st.planned,
		CountBatchesSkipped:   skipped,
		CountBatchesCommitted: st.committed,
		CountBatchesRetried:   st.retried,
		CountUniqueViolations: st.uniqueViolations,
	}
	// Every planned batch committed under our fence: the work is done, even
	// if the lease ended or shutdown began after the last commit (Postgres,
	// not the lease, proved each commit; the final update is fenced too).
	allDone := planned.Load() && st.committed == st.planned
	sample := append([]int64(nil), st.sample...)
	phases := make([]any, 0, 2*len(st.phase))
	for k, v := range st.phase {
		phases = append(phases, k+"_ms", v.Milliseconds())
	}
	st.mu.Unlock()
	r.cfg.Metrics.batch("skipped", int(skipped))

	cause := context.Cause(runCtx)
	var (
		outcome job.Outcome
		reason  string
	)
	switch {
	case allDone:
		outcome = job.OutcomeCompleted
	case cause == nil: // unreachable: workers stop early only after a cancel
		outcome, res.Error = job.OutcomeFailed, "billrun: batches left undone"
	case errors.Is(c.lease.Err(), ownership.ErrLeaseLost):
		outcome, reason = job.OutcomeLost, ReasonLeaseLost
	case errors.Is(cause, errFenceLost):
		outcome, reason = job.OutcomeLost, ReasonFenceLost
	case errors.Is(cause, errShutdown):
		outcome, reason = job.OutcomeLost, ReasonShutdown
	default:
		outcome = job.OutcomeFailed
		res.Error = cause.Error()
	}

	if res.Counts[CountAlreadyInvoiced] > 0 {
		r.send(ctx, c.event(events.BillrunInvoiceConflict, map[string]any{
			CountAlreadyInvoiced: res.Counts[CountAlreadyInvoiced],
			"sample":             sample,
		}))
	}

	// End the run under the fence; it needs Postgres even when ctx is gone.
	endCtx, endCancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer endCancel()
	switch outcome {
	case job.OutcomeCompleted:
		totals, ok, err := c.finish(endCtx, StatusCompleted, nil)
		switch {
		case err != nil:
			outcome, res.Error = job.OutcomeFailed, fmt.Sprintf("billrun: mark COMPLETED: %v", err)
		case !ok:
			outcome, reason = job.OutcomeLost, ReasonFenceLost
		default:
			maps(res.Counts, totals)
		}
	case job.OutcomeLost:
		msg := "interrupted: " + reason
		if _, _, err := c.finish(endCtx, StatusInterrupted, &msg); err != nil {
			c.log.Warn("billrun_mark_interrupted_failed", "err", err)
		}
	}
	if outcome == job.OutcomeFailed {
		msg := res.Error
		if _, ok, err := c.finish(endCtx, StatusFailed, &msg); err != nil || !ok {
			c.log.Warn("billrun_mark_failed_failed", "err", err, "fence_ours", ok)
		}
	}

	res.Outcome = outcome
	res.DurationMS = time.Since(c.start).Milliseconds()
	logArgs := append([]any{"outcome", outcome, "reason", reason, "duration_ms", res.DurationMS,
		"batches_committed", res.Counts[CountBatchesCommitted], "batches_skipped", skipped,
		"invoices_created", res.Counts[CountInvoicesCreated], "already_invoiced", res.Counts[CountAlreadyInvoiced]}, phases...)

	switch outcome {
	case job.OutcomeCompleted:
		r.send(ctx, c.event(events.RunCompleted, countsAny(res.Counts)))
		c.log.Info("billrun_completed", logArgs...)
		c.release(ctx, true)
	case job.OutcomeFailed:
		extra := countsAny(res.Counts)
		extra["error"] = res.Error
		r.send(ctx, c.event(events.RunFailed, extra))
		c.log.Error("billrun_failed", append(logArgs, "err", res.Error)...)
		c.release(ctx, true)
	case job.OutcomeLost:
		res.Error = cmp.Or(res.Error, "ownership lost: "+reason)
		extra := countsAny(res.Counts)
		extra["reason"] = reason
		r.send(ctx, c.event(events.OwnershipLost, extra))
		c.log.Warn("billrun_lost", logArgs...)
		c.release(ctx, false)
	}
	r.cfg.Metrics.outcome(outcome)
	return res
}

func (c *Claimed) event(typ events.Type, extra map[string]any) events.Event {
	if extra == nil {
		extra = map[string]any{}
	}
	extra["lock_fence"] = c.lockFence
	return c.r.event(typ, c.period, c.trigger, c.fence, extra)
}

// release gives up the lease unless it is already gone.
func (c *Claimed) release(ctx context.Context, announce bool) {
	if c.lease.Err() != nil {
		return
	}
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ownership.ReleaseTimeout)
	defer cancel()
	if err := c.lease.Release(relCtx); err != nil {
		if !errors.Is(err, ownership.ErrNotHeld) {
			c.log.Warn("billrun_release_failed", "err", err)
		}
		return
	}
	if announce {
		c.r.send(ctx, c.event(events.OwnershipReleased, nil))
	}
}

func (c *Claimed) committedRanges(ctx context.Context) ([]batchRange, error) {
	rows, err := c.r.pool.Query(ctx, sqlCommittedRanges, c.period.String())
	if err != nil {
		return nil, err
	}
	var out []batchRange
	var b batchRange
	_, err = pgx.ForEachRow(rows, []any{&b.first, &b.last}, func() error {
		out = append(out, b)
		return nil
	})
	return out, err
}

// plan walks ACTIVE subscriber ids in keyset steps of BatchSize, never into
// a committed range: a step is bounded by the next committed range's first
// id, and a committed range is jumped over whole. Batches go to out as they
// are found, so memory stays flat however many subscribers there are.
func (c *Claimed) plan(ctx context.Context, committed []batchRange, out chan<- batchRange, st *runState) error {
	cursor := int64(math.MinInt64)
	next := 0 // index of the first committed range after cursor
	for {
		bound := int64(math.MaxInt64)
		if next < len(committed) {
			bound = committed[next].first - 1
		}
		var b batchRange
		err := c.retry(ctx, "plan", func(ctx context.Context) error {
			return c.r.pool.QueryRow(ctx, sqlNextBatch, cursor, bound, c.r.cfg.BatchSize).Scan(&b.first, &b.last, &b.n)
		})
		if err != nil {
			return err
		}
		if b.n == 0 {
			if next >= len(committed) {
				return nil
			}
			cursor = committed[next].last
			next++
			continue
		}
		st.mu.Lock()
		st.planned++
		st.mu.Unlock()
		select {
		case out <- b:
		case <-ctx.Done():
			return ctx.Err()
		}
		cursor = b.last
	}
}

// work runs batches until the channel closes or the run is cancelled.
func (c *Claimed) work(ctx context.Context, cancel context.CancelCauseFunc, in <-chan batchRange, st *runState) {
	for b := range in {
		if ctx.Err() != nil {
			return
		}
		if hook := c.r.cfg.BeforeBatch; hook != nil {
			if err := hook(ctx, b.first, b.last); err != nil {
				if ctx.Err() == nil {
					cancel(fmt.Errorf("billrun: before batch [%d,%d]: %w", b.first, b.last, err))
				}
				return
			}
			if ctx.Err() != nil {
				return
			}
		}
		if err := c.runBatchRetrying(ctx, b, st); err != nil {
			if ctx.Err() == nil {
				cancel(err)
			}
			return
		}
	}
}

// runBatchRetrying runs one batch, trying again after transient errors and
// escaped unique violations up to MaxBatchAttempts. It returns errFenceLost,
// a *batchError, or nil (committed, or the run was cancelled meanwhile).
func (c *Claimed) runBatchRetrying(ctx context.Context, b batchRange, st *runState) error {
	cfg := c.r.cfg
	for attempt := 1; ; attempt++ {
		out, err := c.runBatch(ctx, b, st, attempt > 1)
		if err == nil {
			st.mu.Lock()
			st.committed++
			st.subscribers += out.subscribers
			st.created += out.created
			st.already += out.subscribers - out.created
			if room := cfg.ConflictSample - len(st.sample); room > 0 {
				st.sample = append(st.sample, out.sample[:min(room, len(out.sample))]...)
			}
			st.mu.Unlock()
			cfg.Metrics.committed(out.created, out.subscribers-out.created)
			return nil
		}
		if ctx.Err() != nil {
			return nil // lost or shutdown: the transaction rolled back
		}
		if errors.Is(err, errFenceLost) {
			cfg.Metrics.batch("fence_lost", 1)
			c.log.Warn("billrun_fence_lost", "first_id", b.first, "last_id", b.last)
			return errFenceLost
		}
		unique := postgres.IsUniqueViolation(err)
		if unique {
			// Never silent, never generic: an invoice conflict, by its code.
			st.mu.Lock()
			st.uniqueViolations++
			st.mu.Unlock()
			cfg.Metrics.uniqueViolation()
			c.r.send(ctx, c.event(events.BillrunInvoiceConflict, map[string]any{
				"sqlstate": postgres.CodeUniqueViolation, "constraint": postgres.ConstraintName(err),
				"first_id": b.first, "last_id": b.last, "attempt": attempt, "error": err.Error(),
			}))
			c.log.Warn("billrun_unique_violation", "first_id", b.first, "last_id", b.last,
				"constraint", postgres.ConstraintName(err), "attempt", attempt)
		}
		if !unique && !postgres.IsTransient(err) || attempt >= cfg.MaxBatchAttempts {
			cfg.Metrics.batch("failed", 1)
			return &batchError{first: b.first, last: b.last, attempts: attempt, err: err}
		}
		st.mu.Lock()
		st.retried++
		st.mu.Unlock()
		cfg.Metrics.batch("retried", 1)
		delay := backoff(cfg.RetryBackoff, attempt)
		c.log.Warn("billrun_batch_retry", "first_id", b.first, "last_id", b.last, "attempt", attempt,
			"delay_ms", delay.Milliseconds(), "err", err)
		if !sleep(ctx, delay) {
			return nil
		}
	}
}

type batchOut struct {
	subscribers, created int64
	sample               []int64
}

// runBatch is one batch transaction: prove the fence, insert the invoices,
// record the batch, commit. On a retry it first looks for the batch's own
// record: a COMMIT whose answer was lost (the connection broke after the
// server committed) must count once, not fail on its own record.
func (c *Claimed) runBatch(ctx context.Context, b batchRange, st *runState, retry bool) (batchOut, error) {
	var out batchOut
	cfg := c.r.cfg
	period := c.period.String()
	phase := func(name string, since time.Time) time.Time {
		now := time.Now()
		d := now.Sub(since)
		cfg.Metrics.observePhase(name, d)
		st.addPhase(name, d)
		return now
	}
	t := time.Now()
	tx, err := c.r.pool.Begin(ctx)
	if err != nil {
		return out, err
	}
	defer func() {
		rbCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rbCtx) // no-op after Commit
	}()
	t = phase(PhaseBegin, t)

	var fence int64
	var idle string
	err = tx.QueryRow(ctx, batchFenceSQL, period, c.fence, cfg.IdleInTransactionTimeout.String()).Scan(&fence, &idle)
	if errors.Is(err, pgx.ErrNoRows) {
		return out, errFenceLost
	}
	if err != nil {
		return out, err
	}
	t = phase(PhaseFenceCheck, t)

	if retry {
		err := tx.QueryRow(ctx, sqlCommittedBatch, period, b.first, c.fence).Scan(&out.subscribers, &out.created)
		if err == nil {
			c.log.Info("billrun_batch_found_committed", "first_id", b.first, "last_id", b.last)
			return out, nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return out, err
		}
	}

	if err := tx.QueryRow(ctx, sqlInsertInvoices, period, c.fence, b.first, b.last, cfg.ConflictSample).
		Scan(&out.subscribers, &out.created, &out.sample); err != nil {
		return out, err
	}
	t = phase(PhaseInsert, t)

	if _, err := tx.Exec(ctx, sqlRecordBatch, period, b.first, b.last, c.fence, cfg.ReplicaID,
		out.subscribers, out.created, out.subscribers-out.created); err != nil {
		return out, err
	}
	t = phase(PhaseRecord, t)

	if err := tx.Commit(ctx); err != nil {
		return out, err
	}
	phase(PhaseCommit, t)
	return out, nil
}

// finish ends the run under the fence. ok false: the fence is no longer
// ours. Transient errors are retried until ctx ends: the row's status is
// worth waiting for (a Postgres restart), and ctx bounds the wait.
func (c *Claimed) finish(ctx context.Context, status string, lastError *string) (map[string]int64, bool, error) {
	var batches, subs, created, already int64
	ok := true
	err := c.retryUntil(ctx, "finish", func(ctx context.Context) error {
		err := c.r.pool.QueryRow(ctx, sqlFinish, c.period.String(), c.fence, status, lastError).
			Scan(&batches, &subs, &created, &already)
		if errors.Is(err, pgx.ErrNoRows) {
			ok = false
			return nil
		}
		return err
	})
	if err != nil {
		return nil, false, err
	}
	return map[string]int64{
		CountPeriodBatches: batches, CountPeriodSubscribers: subs,
		CountPeriodInvoicesCreated: created, CountPeriodAlreadyInvoiced: already,
	}, ok, nil
}

// retry runs fn until it succeeds, fails with a non-transient error, ctx
// ends, or MaxBatchAttempts tries are spent.
func (c *Claimed) retry(ctx context.Context, what string, fn func(context.Context) error) error {
	cfg := c.r.cfg
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil || ctx.Err() != nil || !postgres.IsTransient(err) || attempt >= cfg.MaxBatchAttempts {
			return err
		}
		delay := backoff(cfg.RetryBackoff, attempt)
		c.log.Warn("billrun_retry", "step", what, "attempt", attempt, "delay_ms", delay.Milliseconds(), "err", err)
		if !sleep(ctx, delay) {
			return ctx.Err()
		}
	}
}

// retryUntil is retry bounded by ctx only, with the backoff capped at 1s.
func (c *Claimed) retryUntil(ctx context.Context, what string, fn func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil || ctx.Err() != nil || !postgres.IsTransient(err) {
			return err
		}
		delay := min(backoff(c.r.cfg.RetryBackoff, attempt), time.Second)
		c.log.Warn("billrun_retry", "step", what, "attempt", attempt, "delay_ms", delay.Milliseconds(), "err", err)
		if !sleep(ctx, delay) {
			return err
		}
	}
}

func backoff(base time.Duration, attempt int) time.Duration {
	return base << min(attempt-1, 5)
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func countsAny(m map[string]int64) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func maps(dst, src map[string]int64) {
	for k, v := range src {
		dst[k] = v
	}
}

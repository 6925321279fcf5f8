package msisdnreaper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
)

const (
	// JobName is the job's name in results and events.
	JobName = "msisdn-reaper"
	// SweepKey is the lock every replica's sweep contends for.
	SweepKey = "msisdn-reaper:sweep"
)

// Defaults of Config.
const (
	DefaultLease     = 20 * time.Second
	DefaultBatchSize = 1000
	// DefaultWorkers is the number of concurrent batch transactions; 2 was
	// the best on a 2-core machine (bench/notes/reaper.md).
	DefaultWorkers = 2
)

// Config configures a Sweeper. NewSweeper fills the defaults.
type Config struct {
	// ReplicaID is this replica's id in results and events. Required.
	ReplicaID string
	// Lease is the explicit lease of one sweep: the lock hard-expires after
	// it (or a little after MinHold, if longer) and no batch starts after
	// Lease - SafetyMargin. Default 20s.
	Lease time.Duration
	// BatchSize is the most reservations freed per transaction. Default 1000,
	// at most 100000.
	BatchSize int
	// Workers is the number of batch transactions in flight at once.
	// Default 2, at most 64.
	Workers int
	// MinHold keeps the lock at least this long after it was taken, even
	// when the sweep finished sooner (ShedLock's lockAtLeastFor), so that
	// replicas whose ticks are skewed by less than MinHold do not sweep in
	// turn. Sweep then returns at once and the lock is deleted by a timer at
	// acquired + MinHold (or expires, if the process ends first).
	// Default 0 (release at once); COORDINATOR_REAPER_MIN_HOLD defaults to
	// half the schedule interval.
	MinHold time.Duration
	// SafetyMargin is kept free at the end of the lease: no batch starts
	// after acquired + Lease - SafetyMargin. It must cover one batch and the
	// clock drift between this process and Redis. Default Lease/10.
	SafetyMargin time.Duration
	// Logger receives one line per owned sweep. Default: discard.
	Logger *slog.Logger
	// Metrics may be nil.
	Metrics *Metrics

	// scan picks the batch statement (benchmark comparisons only): "" is
	// the msisdn cursor, "unordered" and "ordered" (by reserved_until) the
	// measured alternatives.
	scan string
}

func (c Config) withDefaults() Config {
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Workers = cmp.Or(c.Workers, DefaultWorkers)
	c.SafetyMargin = cmp.Or(c.SafetyMargin, c.Lease/10)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first field out of range, naming it and its value.
// Zero values are valid (they take the defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.ReplicaID == "":
		return errors.New("msisdnreaper: Config.ReplicaID is required")
	case c.Lease < 0:
		return fmt.Errorf("msisdnreaper: Config.Lease = %s: must be positive", c.Lease)
	case c.BatchSize < 1 || c.BatchSize > 100_000:
		return fmt.Errorf("msisdnreaper: Config.BatchSize = %d: must be 1..100000", c.BatchSize)
	case c.Workers < 1 || c.Workers > 64:
		return fmt.Errorf("msisdnreaper: Config.Workers = %d: must be 1..64", c.Workers)
	case c.MinHold < 0:
		return fmt.Errorf("msisdnreaper: Config.MinHold = %s: must not be negative", c.MinHold)
	case c.SafetyMargin < 0 || c.SafetyMargin >= c.Lease:
		return fmt.Errorf("msisdnreaper: Config.SafetyMargin = %s: must be in [0, Lease=%s)", c.SafetyMargin, c.Lease)
	}
	return nil
}

// Sweeper frees stale reservations while holding SweepKey. Every replica
// runs one; the lock decides which of them sweeps.
type Sweeper struct {
	db     *pgxpool.Pool
	locker ownership.Locker
	emit   events.Emitter
	cfg    Config
	cfgErr error
	sql    string
}

// NewSweeper returns a Sweeper. An invalid cfg is not a panic: every Sweep
// then fails with the error Config.Validate gives (check it at start).
func NewSweeper(db *pgxpool.Pool, locker ownership.Locker, emit events.Emitter, cfg Config) *Sweeper {
	if emit == nil {
		emit = events.Multi{}
	}
	s := &Sweeper{db: db, locker: locker, emit: emit, cfgErr: cfg.Validate(), cfg: cfg.withDefaults(), sql: sqlSweepBatch}
	switch cfg.scan {
	case "unordered":
		s.sql = sqlSweepBatchUnordered
	case "ordered":
		s.sql = sqlSweepBatchOrdered
	}
	return s
}

// sqlSweepBatch frees up to $1 stale reservations after the cursor $2 in
// one statement (its own transaction) and returns how many it freed and the
// highest msisdn among them (the next cursor).
//
//   - now() is the database's clock: a replica's clock never decides
//     staleness.
//   - FOR UPDATE SKIP LOCKED passes over rows that a concurrent Allocate or
//     Release, or the other worker, holds; the outer state check repeats the
//     precondition on the locked row version.
//   - "= any(array(select ...))" runs the subquery once as an init plan and
//     updates through the primary key. The "msisdn in (select ...)"
//     is planned as a hash semi-join over a sequential scan of every RESERVED
//     row: 216 ms per batch of 1000 out of 200,000 rows, growing with the
//     table (measured).
//   - The cursor (msisdn > $2, walking the partial index msisdn_pool_reserved)
//     makes each batch start where the last ended. Without it, each batch's
//     scan steps again over every row freed before it: measured 55 ms for the
//     first batch of 1000 and 156 ms for the last of 500,000 (sequential
//     scan), and 4-6x slower overall when ordered by reserved_until. A row
//     that goes stale behind the cursor during the sweep is freed by the next
//     tick.
const sqlSweepBatch = `
with freed as (
    update msisdn_pool
       set state = 'FREE', reserved_until = null, reserved_by = null, updated_at = now()
     where msisdn = any(array(select msisdn from msisdn_pool
                               where state = 'RESERVED' and reserved_until < now() and msisdn > $2
                               order by msisdn
                               limit $1
                               for update skip locked))
       and state = 'RESERVED'
    returning msisdn)
select count(*), coalesce(max(msisdn), '') from freed`

// sqlSweepBatchUnordered takes any stale rows (no cursor; the planner picks
// a sequential scan). Benchmark comparison only.
const sqlSweepBatchUnordered = `
with freed as (
    update msisdn_pool
       set state = 'FREE', reserved_until = null, reserved_by = null, updated_at = now()
     where msisdn = any(array(select msisdn from msisdn_pool
                               where state = 'RESERVED' and reserved_until < now() and $2::text is not null
                               limit $1
                               for update skip locked))
       and state = 'RESERVED'
    returning msisdn)
select count(*), '' from freed`

// sqlSweepBatchOrdered frees the oldest holds first (an index scan on
// reserved_until). Benchmark comparison only.
const sqlSweepBatchOrdered = `
with freed as (
    update msisdn_pool
       set state = 'FREE', reserved_until = null, reserved_by = null, updated_at = now()
     where msisdn = any(array(select msisdn from msisdn_pool
                               where state = 'RESERVED' and reserved_until < now() and $2::text is not null
                               order by reserved_until
                               limit $1
                               for update skip locked))
       and state = 'RESERVED'
    returning msisdn)
select count(*), '' from freed`

// Stop reasons of an owned sweep.
const (
	stopDrained   = "drained"
	stopDeadline  = "lease_deadline"
	stopLeaseLost = "lease_lost"
	stopShutdown  = "shutdown"
	stopError     = "error"
)

// Sweep takes SweepKey with an explicit lease and, if it wins, frees stale
// reservations in batches until none are left, the lease's local deadline
// (acquired + Lease - SafetyMargin) is reached, the lease is lost, or ctx is
// cancelled; a batch in flight is allowed to finish. Outcomes: completed
// (also when the deadline cut it short: Counts["deadline_reached"] is 1 and
// the next tick frees the rest), already_owned (Owner names the holder),
// unavailable, lost (lease lost or ctx cancelled mid-sweep) and failed.
func (s *Sweeper) Sweep(ctx context.Context, t job.Trigger) job.Result {
	started := time.Now()
	res := job.Result{Job: JobName, Key: SweepKey, Replica: s.cfg.ReplicaID, RequestID: t.RequestID}
	log := s.cfg.Logger.With("lock_key", SweepKey, "request_id", t.RequestID, "trigger", string(t.Source))
	end := func(o job.Outcome) job.Result {
		res.Outcome = o
		res.DurationMS = time.Since(started).Milliseconds()
		s.cfg.Metrics.sweep(string(o))
		return res
	}
	// Events still go out when ctx is cancelled (ownership.lost on shutdown).
	evCtx := context.WithoutCancel(ctx)
	ev := func(typ events.Type, extra map[string]any) {
		s.emit.Emit(evCtx, events.Event{Type: typ, Key: SweepKey, Job: JobName, Replica: s.cfg.ReplicaID,
			Trigger: string(t.Source), RequestID: t.RequestID, Fence: res.Fence, Owner: res.Owner, Extra: extra})
	}
	if s.cfgErr != nil {
		res.Error = s.cfgErr.Error()
		ev(events.RunFailed, map[string]any{"error": res.Error})
		return end(job.OutcomeFailed)
	}

	ttl := max(s.cfg.Lease, holdTTL(s.cfg.MinHold))
	lease, err := s.locker.Acquire(ctx, SweepKey, ttl)
	if err != nil {
		var ae *ownership.AcquireError
		errors.As(err, &ae)
		res.Error = err.Error()
		switch {
		case errors.Is(err, ownership.ErrAlreadyOwned):
			if ae != nil {
				res.Owner = ae.Owner
			}
			log.Info("sweep_already_owned", "owner", res.Owner)
			ev(events.OwnershipAlreadyOwned, nil)
			return end(job.OutcomeAlreadyOwned)
		case errors.Is(err, ownership.ErrUnavailable):
			log.Warn("sweep_lock_unavailable", "error", err)
			ev(events.OwnershipUnavailable, map[string]any{"error": res.Error})
			return end(job.OutcomeUnavailable)
		default:
			log.Error("sweep_acquire_failed", "error", err)
			ev(events.RunFailed, map[string]any{"error": res.Error})
			return end(job.OutcomeFailed)
		}
	}
	// The lock's TTL started before Acquire returned; lease.Done() closes at
	// the adapter's own conservative deadline (request sent + TTL - margin),
	// and SafetyMargin keeps the last batch well inside it.
	acquired := time.Now()
	deadline := acquired.Add(s.cfg.Lease - s.cfg.SafetyMargin)
	res.Fence, res.Owner = lease.Fence(), lease.Owner()
	log = log.With("fence", res.Fence, "owner", res.Owner)
	ev(events.OwnershipAcquired, map[string]any{"lease_ms": ttl.Milliseconds()})

	run := s.free(ctx, lease, deadline)
	res.Counts = map[string]int64{"freed": run.freed, "batches": run.batches, "workers": int64(s.cfg.Workers), "deadline_reached": 0}
	if run.reason == stopDeadline {
		res.Counts["deadline_reached"] = 1
	}
	took := time.Since(acquired)
	s.cfg.Metrics.owned(took, run.reason == stopDeadline, run.reason == stopDrained || run.reason == stopDeadline)
	extra := func(more map[string]any) map[string]any {
		m := map[string]any{"stopped": run.reason}
		for k, v := range res.Counts {
			m[k] = v
		}
		for k, v := range more {
			m[k] = v
		}
		return m
	}

	var outcome job.Outcome
	switch run.reason {
	case stopDrained, stopDeadline:
		outcome = job.OutcomeCompleted
		log.Info("sweep_completed", "freed", run.freed, "batches", run.batches, "stopped", run.reason, "took", took)
		ev(events.RunCompleted, extra(nil))
	case stopLeaseLost, stopShutdown:
		outcome = job.OutcomeLost
		res.Error = fmt.Sprintf("msisdnreaper: sweep stopped: %s", run.reason)
		log.Warn("sweep_lost", "reason", run.reason, "freed", run.freed, "batches", run.batches)
		ev(events.OwnershipLost, extra(map[string]any{"reason": run.reason}))
	default:
		outcome = job.OutcomeFailed
		res.Error = run.err.Error()
		log.Error("sweep_failed", "error", run.err, "freed", run.freed, "batches", run.batches)
		ev(events.RunFailed, extra(map[string]any{"error": res.Error}))
	}
	s.letGo(ctx, lease, acquired, ev, log)
	return end(outcome)
}

// letGo ends this replica's hold. Once MinHold has passed since the lock was
// taken, the lock is released at once (compare-and-delete) under a bounded
// context that outlives a cancelled ctx. Before that, the release is
// deferred to acquired + MinHold (ShedLock's lockAtLeastFor): Sweep returns
// now and a timer deletes the lock then, so the lock lives exactly
// max(MinHold, the sweep). The lease is released, not left to run out, so it
// is not counted or logged as lost. If the process ends first, the lock
// expires with its TTL (holdTTL: a little over MinHold).
func (s *Sweeper) letGo(ctx context.Context, lease ownership.Lease, acquired time.Time,
	ev func(events.Type, map[string]any), log *slog.Logger) {
	if lease.Err() != nil { // lost or run out: nothing of ours is left to release
		return
	}
	if held := time.Since(acquired); held < s.cfg.MinHold {
		remaining := s.cfg.MinHold - held
		log.Info("sweep_release_deferred", "min_hold", s.cfg.MinHold, "release_in", remaining)
		ev(events.OwnershipReleased, map[string]any{"release": "after_min_hold",
			"release_in_ms": remaining.Milliseconds(), "min_hold_ms": s.cfg.MinHold.Milliseconds()})
		time.AfterFunc(remaining, func() {
			relCtx, cancel := context.WithTimeout(context.Background(), ownership.ReleaseTimeout)
			defer cancel()
			if err := lease.Release(relCtx); err != nil && !errors.Is(err, ownership.ErrNotHeld) {
				log.Warn("sweep_release_failed", "error", err)
			}
		})
		return
	}
	relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ownership.ReleaseTimeout)
	defer cancel()
	if err := lease.Release(relCtx); err != nil {
		// TTL expiry is the backstop; the sweep's own outcome stands.
		log.Warn("sweep_release_failed", "error", err)
		return
	}
	ev(events.OwnershipReleased, map[string]any{"release": "delete"})
}

// holdTTL is the lock TTL that covers a minimum hold: long enough that the
// lease's local trust deadline (TTL minus the adapter's safety margin, TTL/20
// + 2ms) falls after acquired + minHold, where the deferred release runs.
func holdTTL(minHold time.Duration) time.Duration {
	if minHold <= 0 {
		return 0
	}
	return minHold + minHold/10 + 100*time.Millisecond
}

type freeRun struct {
	freed, batches int64
	reason         string
	err            error
}

// free runs the batch workers until the sweep must stop, and says why.
func (s *Sweeper) free(ctx context.Context, lease ownership.Lease, deadline time.Time) freeRun {
	var (
		freed, batches atomic.Int64
		mu             sync.Mutex
		reason         string
		firstErr       error
		halt           = make(chan struct{})
		// cursor is the highest msisdn freed so far. Workers start their
		// batches from it; two batches from the same cursor skip each
		// other's locked rows, and every stale row at or below the highest
		// end was taken by one of them.
		cursor   string
		haltOnce sync.Once
		wg       sync.WaitGroup
	)
	stop := func(r string, err error) {
		mu.Lock()
		defer mu.Unlock()
		// The most telling reason wins: an error or a loss over a deadline
		// over running dry.
		if rank(r) > rank(reason) {
			reason, firstErr = r, err
		}
		if r != stopDrained {
			haltOnce.Do(func() { close(halt) })
		}
	}
	// A batch in flight finishes even when ctx or the lease ends (it is
	// correct without the lock); it is bounded by the lease length so a hung
	// database cannot hold a tick forever.
	batchCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Lease)
	defer cancel()
	for range s.cfg.Workers {
		wg.Go(func() {
			for {
				// The deadline first: an explicit lease that ends after it
				// (a batch ran long) ended as planned, it was not lost.
				if !time.Now().Before(deadline) {
					stop(stopDeadline, nil)
					return
				}
				select {
				case <-halt:
					return
				case <-ctx.Done():
					stop(stopShutdown, nil)
					return
				case <-lease.Done():
					stop(stopLeaseLost, nil)
					return
				default:
				}
				t0 := time.Now()
				mu.Lock()
				from := cursor
				mu.Unlock()
				var (
					n    int64
					last string
				)
				if err := s.db.QueryRow(batchCtx, s.sql, s.cfg.BatchSize, from).Scan(&n, &last); err != nil {
					stop(stopError, fmt.Errorf("msisdnreaper: sweep batch: %w", err))
					return
				}
				mu.Lock()
				cursor = max(cursor, last)
				mu.Unlock()
				freed.Add(n)
				batches.Add(1)
				s.cfg.Metrics.batch(n, time.Since(t0))
				if n < int64(s.cfg.BatchSize) {
					// Fewer stale rows than a batch are left unlocked: the
					// other workers' batches in flight hold the rest.
					stop(stopDrained, nil)
					return
				}
			}
		})
	}
	wg.Wait()
	return freeRun{freed: freed.Load(), batches: batches.Load(), reason: reason, err: firstErr}
}

func rank(reason string) int {
	switch reason {
	case stopDrained:
		return 1
	case stopDeadline:
		return 2
	case stopLeaseLost, stopShutdown:
		return 3
	case stopError:
		return 4
	}
	return 0
}

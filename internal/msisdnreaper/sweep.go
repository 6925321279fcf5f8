package msisdnreaper

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
)

const (
	// JobName is the sweep kind's name in results and events.
	JobName = "msisdn-reaper"
	// SweepKey is the lock every replica's sweep contends for.
	SweepKey = "msisdn-reaper:sweep"
	// SweepTopic is the contract's Kafka trigger topic: value
	// {"request_id":"...","requested_by":"..."}.
	SweepTopic = "subscription.msisdn-reaper.requested"
)

// Defaults of Config.
const (
	DefaultLease     = 20 * time.Second
	DefaultBatchSize = 1000
	// DefaultWorkers is the number of concurrent batch transactions; 2 was
	// the best on a 2-core machine (bench/notes/reaper.md).
	DefaultWorkers = 2
)

// Config configures the sweep. Zero fields take the deployment's
// configuration where it has the setting (COORDINATOR_REAPER_*), else the
// defaults named here.
type Config struct {
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
	// turn. The run then returns at once and the template deletes the lock
	// by timer at acquired + MinHold (or it expires, if the process ends
	// first).
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

// SweepKind is the reaper's kind of owned run: `coordinator run reaper`,
// subscription.msisdn-reaper.requested, POST /v1/msisdn-reaper/sweeps
// (synchronous), and COORDINATOR_REAPER_SCHEDULE on every replica.
type SweepKind struct {
	cfg Config
}

// NewSweepKind returns the sweep kind; zero fields of cfg are filled at
// Open (see Config).
func NewSweepKind(cfg Config) *SweepKind { return &SweepKind{cfg: cfg} }

var (
	_ owned.Kind        = (*SweepKind)(nil)
	_ owned.RecordKeyed = (*SweepKind)(nil)
)

// sweepParams are a sweep's: nothing but the CLI's --workers override.
type sweepParams struct {
	workers int
}

func (*SweepKind) Spec() owned.Spec {
	return owned.Spec{Name: JobName, Command: "reaper", Summary: "free expired MSISDN reservations in batches",
		Usage: "[--workers N]", Topic: SweepTopic, HTTPPath: "/v1/msisdn-reaper/sweeps"}
}

// Decode accepts an object with no fields of its own (request_id and
// requested_by are the transport's); an HTTP body may be empty.
func (*SweepKind) Decode(in owned.Input) (owned.Params, error) {
	var none struct{}
	if err := in.Decode(&none); err != nil {
		return nil, err
	}
	return sweepParams{}, nil
}

func (*SweepKind) Encode(owned.Params) ([]byte, map[string]any) { return nil, map[string]any{} }

// Flags: --workers, this run's concurrent batch transactions.
func (*SweepKind) Flags(fs *flag.FlagSet) func([]string) (owned.Params, error) {
	workers := fs.Int("workers", DefaultWorkers, "concurrent batch transactions (1..64)")
	return func(args []string) (owned.Params, error) {
		if len(args) > 0 {
			return nil, job.BadInput("unexpected arguments %q", args)
		}
		if *workers < 1 || *workers > 64 {
			return nil, job.BadInput("--workers = %d: must be 1..64", *workers)
		}
		return sweepParams{workers: *workers}, nil
	}
}

func (*SweepKind) LockKey(owned.Params) string { return SweepKey }

// LockKeyOfRecord: every sweep record asks for the one sweep.
func (*SweepKind) LockKeyOfRecord([]byte) (string, bool) { return SweepKey, true }

// Open checks the configuration (an error names the field and value).
func (k *SweepKind) Open(d owned.Deps) (owned.Worker, error) {
	cfg := k.cfg
	cfg.Lease = cmp.Or(cfg.Lease, d.Config.ReaperLease)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, d.Config.ReaperBatchSize)
	cfg.MinHold = cmp.Or(cfg.MinHold, d.Config.ReaperMinHold)
	if cfg.Logger == nil {
		cfg.Logger = d.Log
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(d.Registerer)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Sweeper{db: d.DB, cfg: cfg.withDefaults(), sql: sqlSweepBatch, schedule: d.Config.ReaperSchedule}
	switch cfg.scan {
	case "unordered":
		s.sql = sqlSweepBatchUnordered
	case "ordered":
		s.sql = sqlSweepBatchOrdered
	}
	return s, nil
}

// Sweeper frees stale reservations while the template holds SweepKey.
// Every replica has one; the lock decides which of them sweeps.
type Sweeper struct {
	db       *pgxpool.Pool
	cfg      Config
	sql      string
	schedule string
}

var (
	_ owned.Leaser    = (*Sweeper)(nil)
	_ owned.Scheduler = (*Sweeper)(nil)
	_ owned.Observer  = (*Sweeper)(nil)
)

// Lease is explicit (Config.Lease) with the minimum hold (Config.MinHold).
func (s *Sweeper) Lease(owned.Params) owned.Lease {
	return owned.Lease{TTL: s.cfg.Lease, MinHold: s.cfg.MinHold}
}

// Schedule is COORDINATOR_REAPER_SCHEDULE.
func (s *Sweeper) Schedule() string { return s.schedule }

// Tick sweeps; a tick has no parameters.
func (s *Sweeper) Tick(time.Time) (owned.Params, error) { return sweepParams{}, nil }

// Observe feeds coordinator_reaper_sweeps_total.
func (s *Sweeper) Observe(res job.Result) { s.cfg.Metrics.sweep(string(res.Outcome)) }

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
       set state = 'FREE', reserved_until = null, reserved_by = null, reservation_token = null, updated_at = now()
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
       set state = 'FREE', reserved_until = null, reserved_by = null, reservation_token = null, updated_at = now()
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
       set state = 'FREE', reserved_until = null, reserved_by = null, reservation_token = null, updated_at = now()
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
	stopLeaseLost = owned.ReasonLeaseLost
	stopShutdown  = owned.ReasonShutdown
	stopError     = "error"
)

// Run frees stale reservations in batches until none are left, the lease's
// local deadline (acquired + Lease - SafetyMargin) is reached, the lease is
// lost, or the caller shuts down; a batch in flight is allowed to finish.
// Running dry or reaching the deadline is completed (Counts
// "deadline_reached" is 1 then, and the next tick frees the rest; data
// "stopped" says which); a lost lease or shutdown is lost with that
// reason; a failed batch fails the sweep.
func (s *Sweeper) Run(ctx context.Context, run *owned.Run, p owned.Params) (owned.Report, error) {
	workers := s.cfg.Workers
	if w := p.(sweepParams).workers; w > 0 {
		workers = w
	}
	// The lock's TTL started before Acquire returned; lease.Done() closes at
	// the adapter's own conservative deadline (request sent + TTL - margin),
	// and SafetyMargin keeps the last batch well inside it.
	deadline := run.Acquired().Add(s.cfg.Lease - s.cfg.SafetyMargin)
	counted := s.countStale(ctx, run)
	fr := s.free(ctx, run, deadline, workers)
	<-counted
	counts := map[string]int64{"freed": fr.freed, "batches": fr.batches, "workers": int64(workers), "deadline_reached": 0}
	if fr.reason == stopDeadline {
		counts["deadline_reached"] = 1
	}
	took := time.Since(run.Acquired())
	s.cfg.Metrics.owned(took, fr.reason == stopDeadline, fr.reason == stopDrained || fr.reason == stopDeadline)
	rep := owned.Report{Counts: counts, Data: map[string]any{"stopped": fr.reason}}
	log := run.Log()
	switch fr.reason {
	case stopDrained, stopDeadline:
		log.Info("sweep_completed", "freed", fr.freed, "batches", fr.batches, "stopped", fr.reason, "took", took)
		return rep, nil
	case stopLeaseLost, stopShutdown:
		log.Warn("sweep_stopped", "reason", fr.reason, "freed", fr.freed, "batches", fr.batches)
		return rep, owned.Lost(fr.reason, nil)
	}
	log.Error("sweep_failed", "error", fr.err, "freed", fr.freed, "batches", fr.batches)
	return rep, fr.err
}

type freeRun struct {
	freed, batches int64
	reason         string
	err            error
}

// free runs the batch workers until the sweep must stop, and says why.
func (s *Sweeper) free(ctx context.Context, run *owned.Run, deadline time.Time, workers int) freeRun {
	lease := run.Lease()
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
	for range workers {
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
					stop(stopReason(ctx, lease), nil)
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
				bctx, span := run.StartSpan(batchCtx, "msisdn-reaper.batch")
				if err := s.db.QueryRow(bctx, s.sql, s.cfg.BatchSize, from).Scan(&n, &last); err != nil {
					span.SetStatus(codes.Error, err.Error())
					span.End()
					stop(stopError, fmt.Errorf("msisdnreaper: sweep batch: %w", err))
					return
				}
				if span.IsRecording() {
					span.SetAttributes(attribute.Int64("msisdn_reaper.freed", n))
				}
				span.End()
				run.Committed(1, n)
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

// sqlCountStale counts the stale reservations a sweep starts with
// (msisdn_pool_stale_reservations, by the database's clock).
const sqlCountStale = `
select count(*) from msisdn_pool where state = 'RESERVED' and reserved_until < now()`

// countStale gives the sweep's progress its total, in batches, counted
// beside the first batches; the returned channel closes when it is done.
func (s *Sweeper) countStale(ctx context.Context, run *owned.Run) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		var n int64
		if err := s.db.QueryRow(ctx, sqlCountStale).Scan(&n); err != nil {
			if ctx.Err() == nil {
				run.Log().Warn("sweep_count_failed", "error", err)
			}
			return
		}
		size := int64(s.cfg.BatchSize)
		run.SetTotal(max((n+size-1)/size, 1)) // an empty pool still takes one batch to find out
	}()
	return done
}

// stopReason tells shutdown (the caller's context ended) from a lost lease
// (the run's context derives from the lease's).
func stopReason(ctx context.Context, lease ownership.Lease) string {
	if lease.Err() == nil && errors.Is(context.Cause(ctx), owned.ErrShutdown) {
		return stopShutdown
	}
	return stopLeaseLost
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

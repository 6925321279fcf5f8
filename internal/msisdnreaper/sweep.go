package msisdnreaper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// Sweeper frees stale reservations while the template holds SweepKey.
// Every replica has one; the lock decides which of them sweeps.
type Sweeper struct {
	db  *pgxpool.Pool
	cfg Config
	// sql forces the batch statement (benchmarks); "": each sweep chooses.
	sql string
}

// sqlSweepBatch frees up to $1 stale reservations after the cursor
// ($2 reserved_until, $3 msisdn) in one statement (its own transaction) and
// returns how many it freed and the (reserved_until, msisdn) of the last
// row it took (the next cursor; null when it took none). It is the walk by
// expiry; sqlSweepBatchMsisdn is the walk by msisdn, and chooseWalk picks
// one per sweep.
//
//   - now() is the database's clock: a replica's clock never decides
//     staleness.
//   - FOR UPDATE SKIP LOCKED passes over rows that a concurrent Allocate or
//     Release, or the other worker, holds; the outer state check repeats the
//     precondition on the locked row version.
//   - Each batch is a range scan of the partial index
//     msisdn_pool_reserved_expiry (reserved_until, msisdn) where RESERVED
//     from the cursor up to now(): it reads only stale rows and stops at
//     the first valid hold. The walk by msisdn reads the heap tuple of every
//     RESERVED row to test reserved_until, so a tick over 1M valid holds
//     cost the same whether 0 or 10,000 were stale (bench/notes/reaper.md).
//     (A covering index, msisdn include reserved_until, does not help: a
//     FOR UPDATE scan cannot be index-only.)
//   - The cursor makes each batch start where the last ended, so no batch
//     steps again over the index entries (dead until vacuum) of rows freed
//     before it: without one, measured quadratic over a sweep. msisdn
//     breaks ties between holds that expired at the same instant.
//   - The rows are picked in a materialized CTE so that the cursor can be read
//     from their old reserved_until (the update's RETURNING sees the new,
//     null one); the update goes through the primary key with
//     "= any(array(...))" (an init plan: "in (select ...)" is planned as a
//     hash semi-join over a scan of every row, measured 216 ms a batch).
const sqlSweepBatch = `
with picked as materialized (
    select msisdn, reserved_until from msisdn_pool
     where state = 'RESERVED' and reserved_until < now()
       and (reserved_until, msisdn) > ($2::timestamptz, $3::text)
     order by reserved_until, msisdn
     limit $1
     for update skip locked),
freed as (
    update msisdn_pool
       set state = 'FREE', reserved_until = null, reserved_by = null, reservation_token = null, updated_at = now()
     where msisdn = any(array(select msisdn from picked))
       and state = 'RESERVED'
    returning msisdn),
last as (
    select reserved_until, msisdn from picked order by reserved_until desc, msisdn desc limit 1)
select (select count(*) from freed), (select reserved_until from last), (select msisdn from last)`

// sqlSweepBatchMsisdn is the walk by msisdn: from the cursor $3 over the
// partial index msisdn_pool_reserved, testing reserved_until on each row's
// heap tuple ($2 unused). It reads every RESERVED row, stale or not, but
// its batches are runs of neighbouring rows (msisdn order is the pool's
// insertion order), so a batch dirties few heap and index pages. A sweep
// takes it when most reservations are stale (chooseWalk); it was the only
// walk before migration 00010.
const sqlSweepBatchMsisdn = `
with freed as (
    update msisdn_pool
       set state = 'FREE', reserved_until = null, reserved_by = null, reservation_token = null, updated_at = now()
     where msisdn = any(array(select msisdn from msisdn_pool
                               where state = 'RESERVED' and reserved_until < now() and msisdn > $3
                                 and $2::timestamptz is not null
                               order by msisdn
                               limit $1
                               for update skip locked))
       and state = 'RESERVED'
    returning msisdn)
select count(*), null::timestamptz, max(msisdn) from freed`

// sqlSweepBatchUnordered takes any stale rows (no cursor; the planner picks
// a sequential scan). Benchmark comparison only.
const sqlSweepBatchUnordered = `
with freed as (
    update msisdn_pool
       set state = 'FREE', reserved_until = null, reserved_by = null, reservation_token = null, updated_at = now()
     where msisdn = any(array(select msisdn from msisdn_pool
                               where state = 'RESERVED' and reserved_until < now()
                                 and $2::timestamptz is not null and $3::text is not null
                               limit $1
                               for update skip locked))
       and state = 'RESERVED'
    returning msisdn)
select count(*), null::timestamptz, null::text from freed`

// sqlSweepBatchOrdered frees the oldest holds first (an index scan on
// reserved_until). Benchmark comparison only.
const sqlSweepBatchOrdered = `
with freed as (
    update msisdn_pool
       set state = 'FREE', reserved_until = null, reserved_by = null, reservation_token = null, updated_at = now()
     where msisdn = any(array(select msisdn from msisdn_pool
                               where state = 'RESERVED' and reserved_until < now()
                                 and $2::timestamptz is not null and $3::text is not null
                               order by reserved_until
                               limit $1
                               for update skip locked))
       and state = 'RESERVED'
    returning msisdn)
select count(*), null::timestamptz, null::text from freed`

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
func (s *Sweeper) Run(ctx context.Context, run *owned.Run, p sweepParams) (owned.Report, error) {
	workers := cmp.Or(p.Workers, s.cfg.Workers)
	// The lock's TTL started before Acquire returned; lease.Done() closes at
	// the adapter's own conservative deadline (request sent + TTL - margin),
	// and SafetyMargin keeps the last batch well inside it.
	deadline := run.Acquired().Add(s.cfg.Lease - s.cfg.SafetyMargin)
	sql, walk := s.chooseWalk(ctx, run)
	fr := s.free(ctx, run, deadline, workers, sql)
	counts := map[string]int64{"freed": fr.freed, "batches": fr.batches, "workers": int64(workers), "deadline_reached": 0}
	if fr.reason == stopDeadline {
		counts["deadline_reached"] = 1
	}
	took := time.Since(run.Acquired())
	s.cfg.Metrics.owned(took, fr.reason == stopDeadline, fr.reason == stopDrained || fr.reason == stopDeadline)
	rep := owned.Report{Counts: counts, Data: map[string]any{"stopped": fr.reason, "walk": walk}}
	log := run.Log()
	switch fr.reason {
	case stopDrained, stopDeadline:
		log.Info("sweep_completed", "freed", fr.freed, "batches", fr.batches, "stopped", fr.reason, "walk", walk, "duration_ms", took.Milliseconds())
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
func (s *Sweeper) free(ctx context.Context, run *owned.Run, deadline time.Time, workers int, sql string) freeRun {
	lease := run.Lease()
	var (
		freed, batches atomic.Int64
		mu             sync.Mutex
		reason         string
		firstErr       error
		halt           = make(chan struct{})
		// cursor is the furthest (reserved_until, msisdn) taken so far.
		// Workers start their batches from it; two batches from the same
		// cursor skip each other's locked rows, and every stale row at or
		// below the furthest end was taken by one of them.
		cursor   = sweepCursor{until: minTime}
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
	// correct without the lock); it is bounded by the lease length from its
	// own start, so a hung database cannot hold a tick forever, and a batch
	// that began just before the local deadline is not cut by a bound that
	// began with the sweep.
	detached := context.WithoutCancel(ctx)
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
					n          int64
					lastUntil  pgtype.Timestamptz
					lastMsisdn pgtype.Text
				)
				batchCtx, cancel := context.WithTimeout(detached, s.cfg.Lease)
				bctx, span := run.StartSpan(batchCtx, "msisdn-reaper.batch")
				err := s.db.QueryRow(bctx, sql, s.cfg.BatchSize, from.untilArg(), from.msisdn).Scan(&n, &lastUntil, &lastMsisdn)
				cancel()
				if err != nil {
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
				if lastMsisdn.Valid {
					mu.Lock()
					cursor = cursor.furthest(sweepCursor{until: lastUntil.Time, msisdn: lastMsisdn.String})
					mu.Unlock()
				}
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

// sweepCursor is where a batch starts: after (until, msisdn) in the order
// of msisdn_pool_reserved_expiry. The zero cursor's until is minTime, sent
// as -infinity (before every hold).
type sweepCursor struct {
	until  time.Time
	msisdn string
}

// minTime stands for -infinity.
var minTime = time.Time{}

func (c sweepCursor) untilArg() pgtype.Timestamptz {
	if c.until.Equal(minTime) {
		return pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	}
	return pgtype.Timestamptz{Time: c.until, Valid: true}
}

// furthest returns the later of c and o in (until, msisdn) order. msisdns
// are compared bytewise, which is the index's order for the pool's numbers
// (decimal digits of one length).
func (c sweepCursor) furthest(o sweepCursor) sweepCursor {
	switch {
	case o.until.After(c.until):
		return o
	case o.until.Equal(c.until) && o.msisdn > c.msisdn:
		return o
	}
	return c
}

// sqlCountStale counts the stale reservations a sweep starts with (an
// index range scan of msisdn_pool_reserved_expiry up to now(), by the
// database's clock: O(stale)) and reads Postgres's estimate of all RESERVED
// rows, the entries of that partial index as of its last VACUUM or ANALYZE
// (-1: unknown).
const sqlCountStale = `
select count(*),
       coalesce((select reltuples::bigint from pg_class where oid = to_regclass('msisdn_pool_reserved_expiry')), -1)
  from msisdn_pool where state = 'RESERVED' and reserved_until < now()`

// Walks of a sweep (the "walk" of its report and log line).
const (
	walkExpiry = "expiry"
	walkMsisdn = "msisdn"
)

// msisdnWalkShare is the share of RESERVED rows that must be stale for a
// sweep to walk by msisdn rather than by expiry. Below it, the walk by
// expiry reads only the stale rows; above it, the walk by msisdn wastes few
// reads on valid holds and its batches of neighbouring rows dirty far fewer
// pages than batches of rows scattered by expiry (the walks crossed between
// 5% and 10% in bench/notes/reaper.md).
const msisdnWalkShare = 0.075

// chooseWalk counts the stale reservations (the progress total, in batches)
// and picks the sweep's batch statement: by expiry when few of the RESERVED
// rows are stale (an idle tick reads nothing but the first valid hold's
// index entry), by msisdn when most are. When the count fails or the
// estimate is unknown, it walks by expiry, which is never worse than
// O(stale) reads.
func (s *Sweeper) chooseWalk(ctx context.Context, run *owned.Run) (sql, walk string) {
	var stale, reserved int64
	err := s.db.QueryRow(ctx, sqlCountStale).Scan(&stale, &reserved)
	if err != nil {
		if ctx.Err() == nil {
			run.Log().Warn("sweep_count_failed", "error", err)
		}
		stale, reserved = 0, -1
	} else {
		size := int64(s.cfg.BatchSize)
		run.SetTotal(max((stale+size-1)/size, 1)) // an empty pool still takes one batch to find out
	}
	if s.sql != "" {
		return s.sql, s.cfg.scan
	}
	if reserved > 0 && float64(stale) >= msisdnWalkShare*float64(reserved) {
		return sqlSweepBatchMsisdn, walkMsisdn
	}
	return sqlSweepBatch, walkExpiry
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

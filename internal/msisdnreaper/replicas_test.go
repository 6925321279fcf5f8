package msisdnreaper

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// The tests in this file run replicas as Sweepers with Redis lockers of
// different owners on the real Redis and Postgres: each locker is what one
// replica process would hold.

// redisLocker returns a replica's Redis locker, closed (with its client) at
// the end of the test.
func redisLocker(t testing.TB, env *testenv.RedisEnv, owner string, wait time.Duration) *redislock.Locker {
	t.Helper()
	client, err := redislock.NewClient(env.URL, "single")
	require.NoError(t, err)
	l, err := redislock.New(client, redislock.Config{Prefix: env.Prefix, Owner: owner, WaitTime: wait})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = l.Close()
		_ = client.Close()
	})
	return l
}

// stamped records events with the local time they were emitted.
type stamped struct {
	mu  sync.Mutex
	evs []events.Event
}

func (s *stamped) Emit(_ context.Context, e events.Event) {
	e.Time = time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evs = append(s.evs, e)
}

func (s *stamped) of(typ events.Type, replica string) []events.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []events.Event
	for _, e := range s.evs {
		if e.Type == typ && (replica == "" || e.Replica == replica) {
			out = append(out, e)
		}
	}
	return out
}

func TestThreeReplicasSweepAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	_, err := Seed(ctx, pg.Pool, SeedSpec{StaleReserved: 30_000, ValidReserved: 10_000, Free: 50_000, Allocated: 10_000})
	require.NoError(t, err)
	check := snapshotKept(t, pg)

	rec := &stamped{}
	replicas := []string{"replica-a", "replica-b", "replica-c"}
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		results = make([]job.Result, len(replicas))
	)
	for i, id := range replicas {
		s := NewTestSweeper(pg.Pool, redisLocker(t, rd, id, 5*time.Second), rec, Config{})
		wg.Go(func() {
			<-start
			results[i] = s.Sweep(ctx, job.Trigger{Source: job.SourceKafka, RequestID: "same-request"})
		})
	}
	close(start)
	wg.Wait()

	var freed int64
	completed := 0
	for _, r := range results {
		switch r.Outcome {
		case job.OutcomeCompleted:
			completed++
			freed += r.Counts["freed"]
		case job.OutcomeAlreadyOwned:
			require.Contains(t, replicas, r.Owner, "already_owned names the owner")
			require.NotEqual(t, r.Replica, r.Owner)
		default:
			t.Fatalf("unexpected outcome %+v", r)
		}
	}
	require.GreaterOrEqual(t, completed, 1)
	require.Equal(t, int64(30_000), freed, "exactly the stale reservations are freed, once")
	check(0)
	require.Equal(t, map[State]int64{StateFree: 80_000, StateReserved: 10_000, StateAllocated: 10_000}, counts(t, pg))

	// The owned sweeps never overlapped: each worked between its acquired
	// and run.completed events (emitted before the release), and the fences
	// increase in that order.
	type span struct {
		from, to time.Time
		fence    int64
	}
	var spans []span
	for _, id := range replicas {
		acq, rel := rec.of(events.OwnershipAcquired, id), rec.of(events.RunCompleted, id)
		require.Equal(t, len(acq), len(rel), id)
		for i := range acq {
			spans = append(spans, span{acq[i].Time, rel[i].Time, acq[i].Fence})
		}
	}
	require.Len(t, spans, completed)
	sort.Slice(spans, func(i, j int) bool { return spans[i].from.Before(spans[j].from) })
	for i := 1; i < len(spans); i++ {
		require.False(t, spans[i].from.Before(spans[i-1].to), "sweeps overlapped: %+v", spans)
		require.Greater(t, spans[i].fence, spans[i-1].fence)
	}
	require.Len(t, rec.of(events.OwnershipReleased, ""), completed)
}

func TestAllocationRacingASweepIsNeverFreed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	p := NewPool(pg.Pool, redisLocker(t, rd, "client", time.Second))
	s := NewTestSweeper(pg.Pool, redisLocker(t, rd, "replica-a", time.Second), nil,
		Config{BatchSize: 10, Workers: 2})

	const iterations, rows = 25, 200
	var totalAllocated, totalFreed, totalRefused int64
	for it := range iterations {
		_, err := pg.Pool.Exec(ctx, "truncate msisdn_pool")
		require.NoError(t, err)
		// Holds that run out one after another over the next 80 ms (database
		// clock), so that allocations and sweeps meet at the boundary.
		_, err = pg.Pool.Exec(ctx, `insert into msisdn_pool (msisdn, state, reserved_until, reserved_by, reservation_token)
			select (447700000000 + i)::text, 'RESERVED', clock_timestamp() + (i % 80) * interval '1 millisecond', 'shop', 'tok-' || i
			from generate_series(0, $1 - 1) i`, rows)
		require.NoError(t, err)

		var (
			mu        sync.Mutex
			allocated = map[string]int64{}
			wg        sync.WaitGroup
			done      = make(chan struct{})
			freed     int64
			errs      = make(chan error, 3)
		)
		order := rand.Perm(rows)
		for w := range 2 {
			wg.Go(func() {
				for k := w; k < rows; k += 2 {
					msisdn := fmt.Sprint(447700000000 + order[k])
					sub := int64(it*rows + order[k])
					err := p.Allocate(ctx, msisdn, fmt.Sprint("tok-", order[k]), sub)
					switch {
					case err == nil:
						mu.Lock()
						allocated[msisdn] = sub
						mu.Unlock()
					case errors.Is(err, ErrIllegalTransition): // expired, or already freed
						mu.Lock()
						totalRefused++
						mu.Unlock()
					default:
						errs <- err
						return
					}
				}
			})
		}
		sweeps := make(chan struct{})
		go func() {
			defer close(sweeps)
			for {
				res := s.Sweep(ctx, cliTrigger)
				if res.Outcome != job.OutcomeCompleted {
					errs <- fmt.Errorf("sweep: %+v", res)
					return
				}
				freed += res.Counts["freed"]
				select {
				case <-done:
					return
				default:
				}
			}
		}()
		wg.Wait()
		close(done)
		<-sweeps
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}

		// Every successful allocation stands, with its subscriber; every FREE
		// row was freed by a sweep and was never allocated.
		dbRows, err := pg.Pool.Query(ctx, `select msisdn, state, subscriber_id from msisdn_pool`)
		require.NoError(t, err)
		var nFree, nAllocated int64
		for dbRows.Next() {
			var m string
			var st State
			var sub *int64
			require.NoError(t, dbRows.Scan(&m, &st, &sub))
			want, wasAllocated := allocated[m]
			switch st {
			case StateAllocated:
				nAllocated++
				require.True(t, wasAllocated, "%s ALLOCATED without a successful Allocate", m)
				require.Equal(t, want, *sub)
			case StateFree:
				nFree++
				require.False(t, wasAllocated, "iteration %d: %s was allocated, then freed by the sweep", it, m)
			case StateReserved:
				require.False(t, wasAllocated, m)
			}
		}
		require.NoError(t, dbRows.Err())
		require.Equal(t, int64(len(allocated)), nAllocated)
		require.Equal(t, freed, nFree, "the sweeps' freed count is what they freed")
		totalAllocated += nAllocated
		totalFreed += nFree
	}
	t.Logf("%d iterations: %d allocated, %d freed by sweeps, %d allocations refused", iterations, totalAllocated, totalFreed, totalRefused)
	require.Positive(t, totalAllocated, "the race had allocations")
	require.Positive(t, totalFreed, "the race had sweeps freeing rows")
}

// slowBatches makes every UPDATE statement on msisdn_pool in this test's
// schema record its start (database clock) and take at least 20 ms.
func slowBatches(t testing.TB, pg *testenv.PG) {
	t.Helper()
	_, err := pg.Pool.Exec(context.Background(), `
		create table sweep_batches (started timestamptz not null);
		create function slow_sweep_batch() returns trigger language plpgsql as $$
		begin
			insert into sweep_batches values (clock_timestamp());
			perform pg_sleep(0.02);
			return null;
		end $$;
		create trigger slow_sweep_batch before update on msisdn_pool
			for each statement execute function slow_sweep_batch();`)
	require.NoError(t, err)
}

func TestShortLeaseStopsBeforeItsDeadlineAndTheNextTickFinishes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	_, err := Seed(ctx, pg.Pool, SeedSpec{StaleReserved: 3000, Free: 1000})
	require.NoError(t, err)
	slowBatches(t, pg)
	// 150 batches of >= 20 ms need >= 3 s; the lease gives 2 s of work, and
	// its 2 s margin absorbs a busy machine's delays between deciding to
	// start a batch and the batch reaching the database.
	const lease, margin = 4 * time.Second, 2 * time.Second
	rec := &events.Recorder{}
	s := NewTestSweeper(pg.Pool, redisLocker(t, rd, "replica-a", time.Second), rec,
		Config{Lease: lease, SafetyMargin: margin, BatchSize: 20, Workers: 1})

	var total int64
	for tick := 1; ; tick++ {
		require.LessOrEqual(t, tick, 10, "ticks did not finish the sweep")
		var before time.Time
		require.NoError(t, pg.Pool.QueryRow(ctx, `select clock_timestamp()`).Scan(&before))
		res := s.Sweep(ctx, job.Trigger{Source: job.SourceCron, RequestID: fmt.Sprint("tick-", tick)})
		require.Equal(t, job.OutcomeCompleted, res.Outcome, "the lease was never lost: %s", res.Error)
		total += res.Counts["freed"]

		// No batch started after the lease's deadline (database clock; the
		// lock was taken after before).
		var batches int64
		var last time.Time
		require.NoError(t, pg.Pool.QueryRow(ctx,
			`select count(*), coalesce(max(started), $1) from sweep_batches where started >= $1`, before).Scan(&batches, &last))
		require.Equal(t, res.Counts["batches"], batches)
		require.Less(t, last.Sub(before), lease, "tick %d started a batch after its lease", tick)

		if tick == 1 {
			require.Equal(t, int64(1), res.Counts["deadline_reached"], "the first tick cannot finish")
			require.Less(t, res.Counts["freed"], int64(3000))
			require.Positive(t, res.Counts["freed"])
		}
		if res.Counts["deadline_reached"] == 0 {
			break
		}
	}
	require.Equal(t, int64(3000), total, "the next ticks freed the rest, each row once")
	require.Equal(t, map[State]int64{StateFree: 4000}, counts(t, pg))
	for _, e := range rec.OfType(events.RunCompleted) {
		require.Contains(t, []any{stopDeadline, stopDrained}, e.Extra["stopped"])
	}
}

func TestMinHoldKeepsASecondReplicaOutForTheInterval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	_, err := Seed(ctx, pg.Pool, SeedSpec{StaleReserved: 10})
	require.NoError(t, err)
	const minHold = 1500 * time.Millisecond
	rec := &stamped{}
	clientA, err := redislock.NewClient(rd.URL, "single")
	require.NoError(t, err)
	regA := prometheus.NewRegistry()
	la, err := redislock.New(clientA, redislock.Config{Prefix: rd.Prefix, Owner: "replica-a", WaitTime: 50 * time.Millisecond,
		Metrics: ownership.NewMetrics(regA)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = la.Close(); _ = clientA.Close() })
	a := NewTestSweeper(pg.Pool, la, rec, Config{Lease: time.Second, MinHold: minHold})
	lb := redisLocker(t, rd, "replica-b", 50*time.Millisecond)
	b := NewTestSweeper(pg.Pool, lb, rec, Config{Lease: time.Second, MinHold: minHold})

	beforeA := time.Now() // A's minimum hold starts after this
	res := a.Sweep(ctx, cliTrigger)
	require.Equal(t, job.OutcomeCompleted, res.Outcome)
	require.Equal(t, int64(10), res.Counts["freed"])
	rel := rec.of(events.OwnershipReleased, "replica-a")
	require.Len(t, rel, 1)
	require.Equal(t, "after_min_hold", rel[0].Extra["release"], "the lock is not deleted before the minimum hold")

	// The lock is still there, A's, although A's sweep is over.
	locks, err := lb.Locks(ctx)
	require.NoError(t, err)
	require.Len(t, locks, 1)
	require.Equal(t, SweepKey, locks[0].Key)
	require.Equal(t, "replica-a", locks[0].Owner)
	require.Greater(t, locks[0].TTL, time.Duration(0))

	// B ticks a little later (skewed clocks): it is told A owns the sweep.
	var tries int
	for {
		tries++
		require.Less(t, tries, 200, "B never got the lock")
		r := b.Sweep(ctx, cliTrigger)
		if r.Outcome == job.OutcomeCompleted {
			break
		}
		require.Equal(t, job.OutcomeAlreadyOwned, r.Outcome, r.Error)
		require.Equal(t, "replica-a", r.Owner)
	}
	// B's event is stamped after B acquired, which is after A's release,
	// which is at least minHold after A acquired, which is after beforeA.
	acquiredB := rec.of(events.OwnershipAcquired, "replica-b")[0].Time
	require.GreaterOrEqual(t, acquiredB.Sub(beforeA), minHold, "B took the lock before A's minimum hold was over")
	require.Greater(t, tries, 1)
	require.NotEmpty(t, rec.of(events.OwnershipAlreadyOwned, "replica-b"))
	// A's lease was released at the end of the hold, not left to run out.
	require.Equal(t, 0.0, counterValue(t, regA, "coordinator_lock_leases_lost_total"))

	// A sweep that outlasts the minimum hold deletes the lock at once.
	c := NewTestSweeper(pg.Pool, redisLocker(t, rd, "replica-c", time.Second), rec,
		Config{MinHold: time.Nanosecond})
	require.Eventually(t, func() bool { return c.Sweep(ctx, cliTrigger).Outcome == job.OutcomeCompleted }, 5*time.Second, 10*time.Millisecond)
	rel = rec.of(events.OwnershipReleased, "replica-c")
	require.Equal(t, "delete", rel[len(rel)-1].Extra["release"])
	locks, err = lb.Locks(ctx)
	require.NoError(t, err)
	require.Empty(t, locks)
}

func TestSweepStopsAtTheNextBatchWhenTheLeaseIsLostOrOnShutdown(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		reason string
	}{{"lease lost", stopLeaseLost}, {"shutdown", stopShutdown}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pg := testenv.Postgres(t)
			rd := testenv.Redis(t)
			_, err := Seed(context.Background(), pg.Pool, SeedSpec{StaleReserved: 3000})
			require.NoError(t, err)
			slowBatches(t, pg)
			l := redisLocker(t, rd, "replica-a", time.Second)
			rec := &events.Recorder{}
			s := NewTestSweeper(pg.Pool, l, rec, Config{Lease: time.Minute, BatchSize: 100, Workers: 1})

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan job.Result, 1)
			go func() { done <- s.Sweep(ctx, cliTrigger) }()
			require.EventuallyWithT(t, func(c *assert.CollectT) {
				var n int
				require.NoError(c, pg.Pool.QueryRow(context.Background(), `select count(*) from sweep_batches`).Scan(&n))
				assert.GreaterOrEqual(c, n, 2, "batches started")
			}, 30*time.Second, 5*time.Millisecond)
			if tc.reason == stopLeaseLost {
				require.NoError(t, l.Close()) // every lease it holds is lost
			} else {
				cancel()
			}
			res := <-done
			require.Equal(t, job.OutcomeLost, res.Outcome)
			require.Equal(t, job.ExitLost, res.Outcome.ExitCode())
			require.Contains(t, res.Error, tc.reason)
			require.Less(t, res.Counts["freed"], int64(3000), "no batch after the stop")
			require.Equal(t, res.Counts["batches"]*100, res.Counts["freed"], "the batch in flight finished")
			var stale int64
			require.NoError(t, pg.Pool.QueryRow(context.Background(),
				`select count(*) from msisdn_pool where state = 'RESERVED'`).Scan(&stale))
			require.Equal(t, 3000-res.Counts["freed"], stale)
			lost := rec.OfType(events.OwnershipLost)
			require.Len(t, lost, 1)
			require.Equal(t, tc.reason, lost[0].Extra["reason"])
			if tc.reason == stopShutdown {
				// On shutdown the lock is released for the next replica.
				require.Equal(t, "delete", rec.OfType(events.OwnershipReleased)[0].Extra["release"])
				require.Empty(t, mustLocks(t, rd))
			}
		})
	}
}

func mustLocks(t testing.TB, rd *testenv.RedisEnv) []string {
	t.Helper()
	keys, err := rd.Client.Keys(context.Background(), rd.Prefix+":*:lock").Result()
	require.NoError(t, err)
	return keys
}

func counterValue(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name {
			var sum float64
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

package msisdnreaper

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/testenv"
)

var cliTrigger = job.Trigger{Source: job.SourceCLI, RequestID: "req-1"}

// snapshotKept copies every row a sweep must not touch (all but the stale
// reservations) and returns a check that they are unchanged, column for
// column, and that no stale reservation is left.
func snapshotKept(t testing.TB, pg *testenv.PG) (check func(wantStaleLeft int64)) {
	t.Helper()
	ctx := context.Background()
	_, err := pg.Pool.Exec(ctx, `create table kept_snapshot as
		select * from msisdn_pool where not (state = 'RESERVED' and reserved_until < now())`)
	require.NoError(t, err)
	return func(wantStaleLeft int64) {
		t.Helper()
		var kept, same, stale int64
		require.NoError(t, pg.Pool.QueryRow(ctx, `select
			(select count(*) from kept_snapshot),
			(select count(*) from kept_snapshot s join msisdn_pool p using (msisdn)
			  where (s.state, s.reserved_until, s.reserved_by, s.subscriber_id, s.updated_at)
			        is not distinct from (p.state, p.reserved_until, p.reserved_by, p.subscriber_id, p.updated_at)),
			(select count(*) from msisdn_pool where state = 'RESERVED' and reserved_until < now())`).
			Scan(&kept, &same, &stale))
		require.Equal(t, kept, same, "valid reservations, allocations and free numbers are untouched")
		require.Equal(t, wantStaleLeft, stale, "stale reservations left")
	}
}

func eventTypes(r *events.Recorder) []events.Type {
	var out []events.Type
	for _, e := range r.Events() {
		out = append(out, e.Type)
	}
	return out
}

func TestSweepFreesOnlyStaleReservations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	_, err := Seed(ctx, pg.Pool, SeedSpec{Free: 100, StaleReserved: 250, ValidReserved: 60, Allocated: 40})
	require.NoError(t, err)
	check := snapshotKept(t, pg)

	rec := &events.Recorder{}
	reg := prometheus.NewRegistry()
	s := NewTestSweeper(pg.Pool, memLocker(t, "replica-a", time.Second), rec,
		Config{BatchSize: 7, Workers: 3, Metrics: NewMetrics(reg)})
	res := s.Sweep(ctx, cliTrigger)
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(250), res.Counts["freed"])
	require.GreaterOrEqual(t, res.Counts["batches"], int64(36))
	require.Equal(t, int64(0), res.Counts["deadline_reached"])
	require.Equal(t, JobName, res.Job)
	require.Equal(t, SweepKey, res.Key)
	require.Equal(t, "replica-a", res.Owner)
	require.Positive(t, res.Fence)
	check(0)
	require.Equal(t, map[State]int64{StateFree: 350, StateReserved: 60, StateAllocated: 40}, counts(t, pg))

	require.Equal(t, []events.Type{events.OwnershipAcquired, events.RunCompleted, events.OwnershipReleased}, eventTypes(rec))
	done := rec.OfType(events.RunCompleted)[0]
	require.Equal(t, int64(250), done.Extra["freed"])
	require.Equal(t, "cli", done.Trigger)
	require.Equal(t, "req-1", done.RequestID)
	require.Equal(t, res.Fence, done.Fence)
	require.Equal(t, "delete", rec.OfType(events.OwnershipReleased)[0].Extra["release"])

	// Nothing stale left: the next sweep frees nothing and still completes.
	res = s.Sweep(ctx, cliTrigger)
	require.Equal(t, job.OutcomeCompleted, res.Outcome)
	require.Equal(t, int64(0), res.Counts["freed"])

	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		require.True(t, strings.HasPrefix(f.GetName(), "coordinator_reaper_"), f.GetName())
		for _, m := range f.GetMetric() {
			if c := m.GetCounter(); c != nil {
				got[f.GetName()] += c.GetValue()
			}
		}
	}
	require.Equal(t, 250.0, got["coordinator_reaper_freed_total"])
	require.Equal(t, 2.0, got["coordinator_reaper_sweeps_total"])
	require.GreaterOrEqual(t, got["coordinator_reaper_batches_total"], 36.0)

	// A nil *Metrics records nothing and does not panic.
	var nilMetrics *Metrics
	nilMetrics.sweep("completed")
	nilMetrics.batch(1, time.Millisecond)
	nilMetrics.owned(time.Millisecond, true, true)
}

// Both walks free every stale hold and nothing else, also when holds
// share one reserved_until across batch boundaries: the walk by expiry
// breaks ties on msisdn (a cursor on reserved_until alone would skip the
// rest of a batch's expiry), with one worker and with workers sharing the
// cursor.
func TestSweepFreesHoldsThatExpiredAtTheSameInstant(t *testing.T) {
	t.Parallel()
	for _, scan := range []string{"expiry", "msisdn"} {
		for _, workers := range []int{1, 3} {
			t.Run(fmt.Sprintf("walk=%s/workers=%d", scan, workers), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				pg := testenv.Postgres(t)
				_, err := Seed(ctx, pg.Pool, SeedSpec{StaleReserved: 95, ValidReserved: 20, Free: 10})
				require.NoError(t, err)
				// Three expiry instants, 30 + 30 + 35 holds each.
				_, err = pg.Pool.Exec(ctx, `update msisdn_pool
					set reserved_until = date_trunc('second', now()) - interval '1 hour' * (1 + msisdn::bigint % 3)
					where state = 'RESERVED' and reserved_until < now()`)
				require.NoError(t, err)
				check := snapshotKept(t, pg)
				rec := &events.Recorder{}
				s := NewTestSweeper(pg.Pool, memLocker(t, "replica-a", time.Second), rec,
					Config{BatchSize: 10, Workers: workers, scan: scan})
				res := s.Sweep(ctx, cliTrigger)
				require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
				require.Equal(t, int64(95), res.Counts["freed"])
				require.Equal(t, scan, rec.OfType(events.RunCompleted)[0].Extra["walk"])
				check(0)
			})
		}
	}
}

// A sweep walks by expiry when few RESERVED rows are stale, by msisdn when
// many are (msisdnWalkShare of Postgres's estimate of RESERVED rows).
func TestSweepChoosesItsWalkByTheShareOfStaleHolds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		stale, valid int
		walk         string
	}{
		{stale: 20, valid: 980, walk: walkExpiry},
		{stale: 0, valid: 1000, walk: walkExpiry},
		{stale: 600, valid: 400, walk: walkMsisdn},
	} {
		t.Run(fmt.Sprintf("stale=%d/valid=%d", c.stale, c.valid), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pg := testenv.Postgres(t)
			_, err := Seed(ctx, pg.Pool, SeedSpec{StaleReserved: c.stale, ValidReserved: c.valid})
			require.NoError(t, err)
			rec := &events.Recorder{}
			s := NewTestSweeper(pg.Pool, memLocker(t, "replica-a", time.Second), rec, Config{BatchSize: 100})
			res := s.Sweep(ctx, cliTrigger)
			require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
			require.Equal(t, int64(c.stale), res.Counts["freed"])
			require.Equal(t, c.walk, rec.OfType(events.RunCompleted)[0].Extra["walk"])
		})
	}
}

func TestSweepFailsClosedWhenTheLockIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	_, err := Seed(ctx, pg.Pool, SeedSpec{StaleReserved: 10})
	require.NoError(t, err)
	l := memLocker(t, "replica-a", time.Second)
	l.SetUnavailable(true)
	rec := &events.Recorder{}
	res := NewTestSweeper(pg.Pool, l, rec, Config{}).Sweep(ctx, cliTrigger)
	require.Equal(t, job.OutcomeUnavailable, res.Outcome)
	require.Equal(t, job.ExitUnavailable, res.Outcome.ExitCode())
	require.Contains(t, res.Error, ownership.CodeLockAcquisitionFailed)
	require.Equal(t, []events.Type{events.OwnershipUnavailable}, eventTypes(rec))
	require.Equal(t, map[State]int64{StateReserved: 10}, counts(t, pg), "nothing runs without the lock")
}

func TestSweepRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Workers: -1}, "Workers = -1"},
		{Config{BatchSize: 100_001}, "BatchSize = 100001"},
		{Config{Lease: time.Second, SafetyMargin: time.Second}, "SafetyMargin = 1s"},
		{Config{Schedule: "@every banana"}, `Schedule = "@every banana"`},
	} {
		require.ErrorContains(t, tc.cfg.Validate(), tc.want)
		// The config is checked when the kind is opened, before anything runs.
		require.ErrorContains(t, owned.CheckOpen(NewSweepKind(tc.cfg), owned.Deps{}), tc.want)
	}
	require.NoError(t, Config{}.Validate())
}

// MinHold's default is half an @every schedule's interval; a negative
// MinHold is none, whatever the schedule (COORDINATOR_REAPER_MIN_HOLD=0s).
func TestMinHoldDefaultsFromTheSchedule(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  Config
		want time.Duration
	}{
		{Config{}, 0},
		{Config{Schedule: "@every 30s"}, 15 * time.Second},
		{Config{Schedule: "0 * * * *"}, 0},
		{Config{Schedule: "@every 30s", MinHold: -1}, 0},
		{Config{Schedule: "@every 30s", MinHold: time.Second}, time.Second},
	} {
		require.Equal(t, tc.want, tc.cfg.withDefaults().MinHold, "%+v", tc.cfg)
	}
}

// Both walks clear the swept reservation's token with its hold (the walk
// by expiry came from a branch written before reservations had tokens).
func TestSweepClearsTheTokenOnEitherWalk(t *testing.T) {
	t.Parallel()
	for _, scan := range []string{walkExpiry, walkMsisdn} {
		t.Run(scan, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pg := testenv.Postgres(t)
			_, err := pg.Pool.Exec(ctx, `insert into msisdn_pool (msisdn, state, reserved_until, reserved_by, reservation_token)
				values ('447700900001', 'RESERVED', now() - interval '1 second', 'shop', 'tok')`)
			require.NoError(t, err)
			rec := &events.Recorder{}
			res := NewTestSweeper(pg.Pool, memLocker(t, "replica-a", time.Second), rec, Config{scan: scan}).Sweep(ctx, cliTrigger)
			require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
			require.Equal(t, int64(1), res.Counts["freed"])
			require.Equal(t, scan, rec.OfType(events.RunCompleted)[0].Extra["walk"])
			var token *string
			require.NoError(t, pg.Pool.QueryRow(ctx, `select reservation_token from msisdn_pool where msisdn = '447700900001'`).Scan(&token))
			require.Nil(t, token, "the sweep left the token of a freed number")
		})
	}
}

// A batch in flight at the lease's end finishes, as the package doc says: its
// bound is Lease from its own start. It was Lease from the sweep's start, so
// the batch that began just before the local deadline was cancelled when the
// lease ran out, and the sweep ended lost (76): `COORDINATOR_REAPER_LEASE=1s
// COORDINATOR_REAPER_BATCH_SIZE=70000 coordinator run reaper --workers 1` on
// 200k stale rows. Here the batches are made slow in the database (a
// statement trigger sleeps 2.0 s in the first, 2.5 s in the second), with a
// 4 s lease and its local deadline at 3.9 s: the second batch starts near
// 2.0 s, before the deadline, and ends near 4.5 s, past the lease. The
// figures leave a loaded machine 1.9 s before the deadline and 1.5 s inside
// the batch's own bound (with a 2 s lease and 1.0/1.5 s sleeps they were
// 0.9 s and 0.5 s).
func TestABatchInFlightAtTheLeasesEndFinishes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	_, err := Seed(ctx, pg.Pool, SeedSpec{StaleReserved: 30})
	require.NoError(t, err)
	_, err = pg.Pool.Exec(ctx, `
create sequence slow_batches;
create function slow_batch() returns trigger language plpgsql as $$
begin
  case nextval('slow_batches')
    when 1 then perform pg_sleep(2.0);
    when 2 then perform pg_sleep(2.5);
    else null;
  end case;
  return null;
end $$;
create trigger slow_batch before update on msisdn_pool for each statement execute function slow_batch();`)
	require.NoError(t, err)

	rec := &events.Recorder{}
	s := NewTestSweeper(pg.Pool, memLocker(t, "replica-a", time.Second), rec,
		Config{Lease: 4 * time.Second, SafetyMargin: 100 * time.Millisecond, BatchSize: 10, Workers: 1})
	res := s.Sweep(ctx, cliTrigger)
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(20), res.Counts["freed"], "the second batch, in flight at the lease's end, committed")
	require.Equal(t, int64(1), res.Counts["deadline_reached"])
	require.Equal(t, map[State]int64{StateFree: 20, StateReserved: 10}, counts(t, pg))
	require.Equal(t, events.OwnershipLost, eventTypes(rec)[len(eventTypes(rec))-1],
		"the lease ran out under the batch: the term ends lost after the run")
}

package e2e

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/msisdnreaper"
)

// The cron reaper on three replicas: every replica ticks at the same
// wall-clock second; one sweeps, the others emit already_owned naming it.
func TestCronReaperOneSweepPerTick(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, "")
	const stale, valid = 700, 100
	ctx := context.Background()
	_, err := msisdnreaper.Seed(ctx, d.pg.Pool, msisdnreaper.SeedSpec{Free: 100, StaleReserved: stale, ValidReserved: valid, Allocated: 100})
	require.NoError(t, err)

	// Every 3 s on the wall clock; the lock lives 2 s (lease and minimum
	// hold), so it is gone before the next tick and held across this one.
	// No catch-up: a replica starting between two ticks would sweep at once,
	// off the wall-clock grid this test counts ticks on.
	rs := d.startReplicas(3, map[string]string{
		"COORDINATOR_REAPER_LEASE":        "2s",
		"COORDINATOR_REAPER_MIN_HOLD":     "2s",
		"COORDINATOR_CRON_CATCHUP_WINDOW": "0",
	}, "--reaper-schedule=*/3 * * * * *")
	allUp := time.Now()
	key := msisdnreaper.SweepKey

	// Wait for three complete ticks after all replicas are up.
	tickOf := func(e event) int64 { return e.Time.Add(1500*time.Millisecond).Unix() / 3 }
	cron := func(e event) bool {
		return e.Subject == key && e.str("trigger") == "cron" && e.Time.After(allUp) &&
			(e.Type == "run.completed" || e.Type == "ownership.already_owned")
	}
	// group sorts the events seen so far into ticks; full counts the ticks
	// with an outcome from every replica.
	group := func() (ticks map[int64][]event, order []int64, full int) {
		ticks = map[int64][]event{}
		for _, e := range d.events.match(cron) {
			n := tickOf(e)
			if _, ok := ticks[n]; !ok {
				order = append(order, n)
			}
			ticks[n] = append(ticks[n], e)
		}
		sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
		for _, n := range order {
			if len(ticks[n]) == len(rs) {
				full++
			}
		}
		return ticks, order, full
	}
	require.Eventually(t, func() bool { _, _, full := group(); return full >= 3 }, 45*time.Second, 50*time.Millisecond,
		"three ticks with an outcome from every replica")
	ticks, order, _ := group()

	owners := map[string]bool{}
	for _, n := range order {
		evs := ticks[n]
		if len(evs) < len(rs) {
			continue // a tick still in progress at the edge of the window
		}
		var sweeper string
		completed := 0
		for _, e := range evs {
			if e.Type == "run.completed" {
				completed++
				sweeper = e.str("replica")
			}
		}
		require.Equal(t, 1, completed, "one sweep in tick %d: %v", n, evs)
		replicas := map[string]bool{}
		for _, e := range evs {
			replicas[e.str("replica")] = true
			if e.Type == "ownership.already_owned" {
				require.Equal(t, sweeper, e.str("owner"), "already_owned names the sweeper")
			}
		}
		require.Len(t, replicas, len(rs), "every replica ticked")
		owners[sweeper] = true
	}
	t.Logf("sweepers per tick: %v", owners)

	var stillStale, validLeft int64
	require.NoError(t, d.pg.Pool.QueryRow(ctx,
		`select count(*) filter (where reserved_until < now()), count(*) filter (where reserved_until >= now())
		   from msisdn_pool where state = 'RESERVED'`).Scan(&stillStale, &validLeft))
	require.Zero(t, stillStale)
	require.EqualValues(t, valid, validLeft, "valid reservations untouched")
	// Every stale reservation was freed exactly once, over all sweeps.
	var freed int64
	for _, e := range d.events.match(ofType("run.completed", key)) {
		freed += e.num("freed")
	}
	require.EqualValues(t, stale, freed)
}

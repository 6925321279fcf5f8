package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/testenv"
)

// Redis stopped: a trigger is not committed and ownership.unavailable is
// emitted (again, as the partition is retried); Redis back: the trigger is
// processed, nothing lost.
func TestRedisDownTriggerIsRetriedNotLost(t *testing.T) {
	t.Parallel()
	rds := testenv.StartRedisServer(t)
	d := newDeployment(t, rds.URL())
	period := monthsAgo(4)
	key := "billrun:" + period
	d.seedSubscribers(500, period)
	d.startReplicas(3, nil, "--reaper-schedule=")

	rds.Stop()
	partition, offset := d.produce(d.bills, period, billRunTrigger(period, "while-down"))

	// At least two unavailable events: the record is tried again, not skipped.
	unavailable := d.events.waitFor(t, 45*time.Second, 2, "ownership.unavailable", ofType("ownership.unavailable", key))
	require.Equal(t, "while-down", unavailable[0].str("request_id"))
	require.Equal(t, unavailable[0].str("replica"), unavailable[1].str("replica"), "retried on the partition's owner")
	require.LessOrEqual(t, d.committed(d.bills, partition), offset, "not committed while Redis is down")
	require.Empty(t, d.events.match(ofType("run.completed", key)))
	var rows int64
	require.NoError(t, d.pg.Pool.QueryRow(context.Background(), `select count(*) from invoices`).Scan(&rows))
	require.Zero(t, rows, "fail closed: nothing ran without the lock")

	rds.Start()
	done := d.events.waitFor(t, 60*time.Second, 1, "run.completed", ofType("run.completed", key))
	require.Equal(t, "while-down", done[0].str("request_id"))
	d.requireInvoicesExact(period)
	d.waitCommitted(d.bills, partition, offset+1, 20*time.Second)
}

package trigger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/trigger"
)

func TestRedisDownTriggerIsRetriedNotCommittedThenProcessed(t *testing.T) {
	t.Parallel()
	kb := setupKafka(t)
	rs := testenv.StartRedisServer(t)
	pg := testenv.Postgres(t)
	ctx := context.Background()
	_, err := billrun.Seed(ctx, pg.Pool, billrun.SeedConfig{Subscribers: 20})
	require.NoError(t, err)

	rc, err := redislock.NewClient(rs.URL(), "single")
	require.NoError(t, err)
	defer rc.Close()
	locker, err := redislock.New(rc, redislock.Config{Owner: "r1", WaitTime: 200 * time.Millisecond, WatchdogTimeout: 2 * time.Second})
	require.NoError(t, err)
	defer locker.Close()
	runner := billrun.New(pg.Pool, locker, kb.rec, billrun.Config{ReplicaID: "r1", BatchSize: 5})
	d := trigger.NewDispatcher(trigger.DispatcherConfig{BillRuns: runner, Replica: "r1"})
	defer d.Shutdown(ctx)
	kb.consumer(t, d, nil)

	rs.Stop() // the lock backend goes away
	rec := kb.produce(t, kb.names.BillrunRequested, "2026-05", `{"period":"2026-05","request_id":"outage-1"}`)

	waitEvents(t, kb.rec, events.OwnershipUnavailable, 2) // retried, not given up
	u := kb.rec.OfType(events.OwnershipUnavailable)[0]
	require.Equal(t, "billrun:2026-05", u.Key)
	require.Equal(t, "outage-1", u.RequestID)
	require.Equal(t, int64(-1), kb.committed(t, rec), "not committed while Redis is down")
	require.Empty(t, kb.rec.OfType(events.OwnershipAcquired))

	rs.Start() // Redis is back: the retried trigger goes through
	waitEvents(t, kb.rec, events.RunCompleted, 1)
	kb.waitCommitted(t, rec, rec.Offset+1)
	st, err := runner.Status(ctx, billrun.Period{Year: 2026, Month: 5})
	require.NoError(t, err)
	require.Equal(t, billrun.StatusCompleted, st.Status)
	var invoices int
	require.NoError(t, pg.Pool.QueryRow(ctx, "select count(*) from invoices where period = '2026-05'").Scan(&invoices))
	require.Equal(t, 20, invoices, "every ACTIVE subscriber invoiced once")
}

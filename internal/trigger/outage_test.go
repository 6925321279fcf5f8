package trigger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/trigger"
)

func TestRedisDownTriggerIsRetriedNotCommittedThenProcessed(t *testing.T) {
	t.Parallel()
	kb := setupKafka(t)
	rs := testenv.StartRedisServer(t)
	ctx := context.Background()
	rc, err := redislock.NewClient(rs.URL(), "single")
	require.NoError(t, err)
	defer rc.Close()
	locker, err := redislock.New(rc, redislock.Config{Owner: "r1", WaitTime: 200 * time.Millisecond, WatchdogTimeout: 2 * time.Second})
	require.NoError(t, err)
	defer locker.Close()
	d := trigger.NewDispatcher(trigger.DispatcherConfig{Runner: widgetRunner(t, &ownedtest.Widget{}, locker, kb.rec)})
	defer d.Shutdown(ctx)
	kb.consumer(t, d, nil)

	rs.Stop() // the lock backend goes away
	rec := kb.produce(t, kb.widgets, "5", `{"n":5,"request_id":"outage-1"}`)

	waitEvents(t, kb.rec, events.OwnershipUnavailable, 2) // retried, not given up
	u := kb.rec.OfType(events.OwnershipUnavailable)[0]
	require.Equal(t, "widget:5", u.Key)
	require.Equal(t, "outage-1", u.RequestID)
	require.Equal(t, int64(-1), kb.committed(t, rec), "not committed while Redis is down")
	require.Empty(t, kb.rec.OfType(events.OwnershipAcquired))

	rs.Start() // Redis is back: the retried trigger goes through
	waitEvents(t, kb.rec, events.RunCompleted, 1)
	kb.waitCommitted(t, rec, rec.Offset+1)
	require.Len(t, kb.rec.OfType(events.RunCompleted), 1, "run once, after Redis came back")
	require.Equal(t, "outage-1", kb.rec.OfType(events.RunCompleted)[0].RequestID)
}

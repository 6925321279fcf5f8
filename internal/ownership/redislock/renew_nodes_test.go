package redislock_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// A renewal round's pipelines to different masters go out side by side:
// a master that stops answering holds up only the renewals of its own
// leases. Before, the groups were sent one after another, so a stalled
// master ahead in slot order used up the round's budget and the leases on
// a healthy master were never renewed, and were lost at their trust
// deadline.
func TestAStalledMasterHoldsUpOnlyItsOwnRenewals(t *testing.T) {
	t.Parallel()
	cluster := testenv.StartRedisCluster(t, 2, 0)
	client, err := redislock.NewClient(cluster.URL(), redislock.ModeCluster)
	require.NoError(t, err)
	const watchdog = 3 * time.Second
	l, err := redislock.New(client, redislock.Config{Prefix: "rn", Owner: "rn", WatchdogTimeout: watchdog})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = l.Close()
		_ = client.Close()
	})
	// stalled: a key on the master of the lower slots (renewed first);
	// healthy: a key on the other master.
	var stalled, healthy string
	var stalledMaster *testenv.RedisServer
	for i := 0; stalled == "" || healthy == ""; i++ {
		k := "k" + strconv.Itoa(i)
		s := redislock.SlotOf("rn:{" + k + "}:lock")
		m := cluster.MasterOf(t, s)
		switch {
		case m == cluster.Masters[0] && s < 8192 && stalled == "":
			stalled, stalledMaster = k, m
		case m != cluster.Masters[0] && healthy == "":
			healthy = k
		}
	}
	ctx := context.Background()
	a, err := l.Acquire(ctx, stalled, 0)
	require.NoError(t, err)
	b, err := l.Acquire(ctx, healthy, 0)
	require.NoError(t, err)
	first, ok := l.TrustDeadline(b)
	require.True(t, ok)
	// Under the cluster's node timeout (5s): the other master stays up.
	stalledMaster.Pause()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			stalledMaster.Resume()
		}
	}
	t.Cleanup(resume)
	require.Eventually(t, func() bool {
		d, ok := l.TrustDeadline(b)
		return ok && d.After(first.Add(watchdog/2))
	}, 4*time.Second, 20*time.Millisecond, "the lease on the healthy master was not renewed while the other stalled")
	resume()
	select {
	case <-b.Done():
		t.Fatalf("the lease on the healthy master was lost: %v", b.Err())
	default:
	}
	_ = a.Release(ctx)
	require.NoError(t, b.Release(ctx))
}

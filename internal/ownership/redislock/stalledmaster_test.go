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

// Calls the cluster client carries alone (no WAIT) queue per node: while
// a stalled master's calls fill the pipelines of its own, an acquisition
// on a healthy master goes out at once. Before, all masters shared one
// queue, and the healthy master's acquisition waited behind the stalled
// one's until its own context ended.
func TestAStalledMasterHoldsUpOnlyItsOwnCalls(t *testing.T) {
	t.Parallel()
	cluster := testenv.StartRedisCluster(t, 2, 0)
	client, err := redislock.NewClient(cluster.URL(), redislock.ModeCluster)
	require.NoError(t, err)
	log := &pipelineLog{alone: make(chan struct{}, 64)}
	client.AddHook(log)
	l, err := redislock.New(client, redislock.Config{Prefix: "rc", Owner: "rc"})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = l.Close()
		_ = client.Close()
	})
	var onStalled []string
	var healthy string
	for i := 0; len(onStalled) < 2 || healthy == ""; i++ {
		k := "k" + strconv.Itoa(i)
		if cluster.MasterOf(t, redislock.SlotOf("rc:{"+k+"}:lock")) == cluster.Masters[0] {
			if len(onStalled) < 2 {
				onStalled = append(onStalled, k)
			}
		} else if healthy == "" {
			healthy = k
		}
	}
	ctx := context.Background()
	for _, k := range append(onStalled, healthy) { // scripts loaded, the server known
		le, err := l.Acquire(ctx, k, 0)
		require.NoError(t, err)
		require.NoError(t, le.Release(ctx))
	}
	for len(log.alone) > 0 {
		<-log.alone
	}
	cluster.Masters[0].Pause()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			cluster.Masters[0].Resume()
		}
	}
	t.Cleanup(resume)
	stuck := make([]<-chan acquired, len(onStalled))
	for i, k := range onStalled {
		stuck[i] = acquireWithinAsync(ctx, l, k, 4*time.Second)
	}
	for range onStalled {
		select {
		case <-log.alone:
		case <-time.After(10 * time.Second):
			t.Fatal("the acquisitions on the stalled master were not sent")
		}
	}
	le, err := l.AcquireWithin(ctx, healthy, 0, 0)
	resume()
	require.NoError(t, err, "the acquisition on the healthy master waited behind the stalled master's")
	require.NoError(t, le.Release(ctx))
	for _, ch := range stuck {
		if r := <-ch; r.err == nil {
			_ = r.le.Release(ctx)
		}
	}
}

func acquireWithinAsync(ctx context.Context, l *redislock.Locker, key string, wait time.Duration) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		le, err := l.AcquireWithin(ctx, key, 0, wait)
		ch <- acquired{le, err}
	}()
	return ch
}

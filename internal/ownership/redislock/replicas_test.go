package redislock_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// A fixed replica count that the server cannot meet (one more than it has:
// the test server has none, the shared cluster's masters one each, or none
// when it was made without): every acquisition fails closed as unavailable
// with ErrUnreplicated, and the lock the script wrote on the master is
// deleted. In cluster mode WAIT goes, in the same pipeline as the script, to
// the master of the key's slot, for keys on every master.
func TestMissingReplicasFailClosed(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	clusterURL, clusterPrefix, clusterAdmin := clusterEnv(t)
	var clusterReplicas atomic.Int64
	require.NoError(t, clusterAdmin.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "replication").Result()
		n := int64(strings.Count(info, "state=online"))
		for {
			old := clusterReplicas.Load()
			if n <= old || clusterReplicas.CompareAndSwap(old, n) {
				return err
			}
		}
	}))
	for _, c := range []struct {
		name, url, mode, prefix string
		admin                   redis.UniversalClient
		replicas                int
	}{
		{"single", env.URL, redislock.ModeSingle, env.Prefix, env.Client, 0},
		{"cluster", clusterURL, redislock.ModeCluster, clusterPrefix, clusterAdmin, int(clusterReplicas.Load())},
	} {
		t.Run(c.name, func(t *testing.T) {
			client, err := redislock.NewClient(c.url, c.mode)
			require.NoError(t, err)
			t.Cleanup(func() { _ = client.Close() })
			l, err := redislock.New(client, redislock.Config{Prefix: c.prefix, Owner: "a", WaitTime: time.Second, WaitReplicas: c.replicas + 1, ReplicaTimeout: 50 * time.Millisecond})
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close() })
			ctx := context.Background()
			// Keys that hash to different slots (and, in the cluster, masters).
			for _, key := range []string{"a", "b", "c", "d", "e", "f"} {
				_, err := l.Acquire(ctx, key, 0)
				require.ErrorIs(t, err, ownership.ErrUnavailable, key)
				require.ErrorIs(t, err, redislock.ErrUnreplicated, key)
				require.Eventually(t, func() bool {
					n, err := c.admin.Exists(ctx, c.prefix+":{"+key+"}:lock").Result()
					return err == nil && n == 0
				}, 5*time.Second, 10*time.Millisecond, "the unreplicated lock on %q was left behind", key)
			}
		})
	}
}

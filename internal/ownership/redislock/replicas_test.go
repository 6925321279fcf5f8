package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// A fixed replica count that the server cannot meet (the test servers have
// no replicas): every acquisition fails closed as unavailable with
// ErrUnreplicated, and the lock the script wrote on the master is deleted.
// In cluster mode WAIT goes, in the same pipeline as the script, to the
// master of the key's slot, for keys on every master.
func TestMissingReplicasFailClosed(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	clusterURL, clusterPrefix, clusterAdmin := clusterEnv(t)
	for _, c := range []struct {
		name, url, mode, prefix string
		admin                   redis.UniversalClient
	}{
		{"single", env.URL, redislock.ModeSingle, env.Prefix, env.Client},
		{"cluster", clusterURL, redislock.ModeCluster, clusterPrefix, clusterAdmin},
	} {
		t.Run(c.name, func(t *testing.T) {
			client, err := redislock.NewClient(c.url, c.mode)
			require.NoError(t, err)
			t.Cleanup(func() { _ = client.Close() })
			l, err := redislock.New(client, redislock.Config{Prefix: c.prefix, Owner: "a", WaitTime: time.Second, WaitReplicas: 1, ReplicaTimeout: 50 * time.Millisecond})
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

package redislock_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/ownershiptest"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func TestMain(m *testing.M) {
	if helperMain() {
		return
	}
	goleak.VerifyTestMain(m)
}

// newLocker opens a client of its own on url and a Locker on it; both are
// closed when the test ends.
func newLocker(t testing.TB, url, mode, prefix string, o ownershiptest.Options) *redislock.Locker {
	t.Helper()
	return newLayoutLocker(t, url, mode, prefix, redislock.LayoutCoordinator, o)
}

// newLayoutLocker is newLocker in the given layout.
func newLayoutLocker(t testing.TB, url, mode, prefix string, layout redislock.Layout, o ownershiptest.Options) *redislock.Locker {
	t.Helper()
	client, err := redislock.NewClient(url, mode)
	require.NoError(t, err)
	l, err := redislock.New(client, redislock.Config{
		Prefix: prefix, Owner: o.Owner, WaitTime: o.WaitTime, WatchdogTimeout: o.WatchdogTimeout, Metrics: o.Metrics, Layout: layout,
		// Where there is a replica (Sentinel), a busy machine's may take
		// longer than the default 200ms to acknowledge.
		ReplicaTimeout: 1500 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = l.Close()
		_ = client.Close()
	})
	return l
}

// closedAddr is a loopback address nobody listens on.
func closedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

func backend(url, mode, prefix string, admin redis.UniversalClient) ownershiptest.Backend {
	return layoutBackend(url, mode, prefix, redislock.LayoutCoordinator, admin)
}

func layoutBackend(url, mode, prefix string, layout redislock.Layout, admin redis.UniversalClient) ownershiptest.Backend {
	return ownershiptest.Backend{
		Shared: true,
		New: func(t *testing.T, o ownershiptest.Options) ownership.Locker {
			return newLayoutLocker(t, url, mode, prefix, layout, o)
		},
		DeleteLock: func(t *testing.T, _ ownership.Locker, key string) {
			lockKey := prefix + ":{" + key + "}:lock"
			if layout == redislock.LayoutRedisson {
				lockKey = key
			}
			require.NoError(t, admin.Del(context.Background(), lockKey).Err())
		},
		NewUnreachable: func(t *testing.T, o ownershiptest.Options) ownership.Locker {
			return newLayoutLocker(t, "redis://"+closedAddr(t), "single", prefix, layout, o)
		},
	}
}

func TestConformanceSingle(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	ownershiptest.Run(t, backend(env.URL, redislock.ModeSingle, env.Prefix, env.Client))
}

// clusterEnv is the 3-master test cluster and a key prefix of the test's
// own, deleted when it ends.
func clusterEnv(t testing.TB) (url string, prefix string, admin *redis.ClusterClient) {
	t.Helper()
	addrs := testenv.RedisClusterAddrs(t)
	admin = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, admin.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() }),
		"Redis Cluster at %s", strings.Join(addrs, ","))
	prefix = testenv.UniqueName("t")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = admin.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
			for iter.Next(ctx) {
				c.Del(ctx, iter.Val())
			}
			return iter.Err()
		})
		_ = admin.Close()
	})
	// go-redis' cluster URL: one seed in the authority, the others as addr options.
	return "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr="), prefix, admin
}

func TestConformanceCluster(t *testing.T) {
	t.Parallel()
	url, prefix, admin := clusterEnv(t)
	ownershiptest.Run(t, backend(url, redislock.ModeCluster, prefix, admin))
}

// A key prefix with glob characters must not break SCAN (Locks) or the
// release notification: it is matched literally.
func TestConformanceGlobPrefix(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	prefix := env.Prefix + `:g[1]*?\x`
	t.Cleanup(func() {
		ctx := context.Background()
		iter := env.Client.Scan(ctx, 0, env.Prefix+":g*", 1000).Iterator()
		for iter.Next(ctx) {
			env.Client.Del(ctx, iter.Val())
		}
	})
	ownershiptest.Run(t, backend(env.URL, redislock.ModeSingle, prefix, env.Client))
}

// The redisson layout keeps every promise of the suite.
func TestConformanceRedissonLayoutSingle(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	ownershiptest.Run(t, layoutBackend(env.URL, redislock.ModeSingle, env.Prefix, redislock.LayoutRedisson, env.Client))
}

func TestConformanceRedissonLayoutCluster(t *testing.T) {
	t.Parallel()
	url, prefix, admin := clusterEnv(t)
	ownershiptest.Run(t, layoutBackend(url, redislock.ModeCluster, prefix, redislock.LayoutRedisson, admin))
}

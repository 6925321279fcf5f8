package redislock_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/ownershiptest"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// Redis dies while a watchdog lease is held: the lease is lost at its trust
// deadline (not before, and not long after). Redis comes back empty: the
// same Locker's renewal loop and subscription keep working (reconnect,
// NOSCRIPT reload), so a new watchdog lease is renewed again and again, and
// a waiter still wakes on a release message.
func TestRedisRestart(t *testing.T) {
	t.Parallel()
	// A 3s TTL: the first renewal is due 1s after the acquisition, long
	// after Redis dies, so the trust deadline is the acquisition's own.
	const ttl = 3 * time.Second
	srv := startThrowaway(t)
	ctx := context.Background()
	m := ownership.NewMetrics(nil)
	a := newLocker(t, srv.URL(), redislock.ModeSingle, "rs", ownershiptest.Options{Owner: "a", WaitTime: 3 * time.Second, WatchdogTimeout: ttl, Metrics: m})
	b := newLocker(t, srv.URL(), redislock.ModeSingle, "rs", ownershiptest.Options{Owner: "b", WaitTime: time.Minute, WatchdogTimeout: ttl})
	renewedOK := func() float64 { return testutil.ToFloat64(m.RenewalsCounter(ownership.RenewalOK)) }

	sent := time.Now()
	held, err := a.Acquire(ctx, "job", 0)
	require.NoError(t, err)
	srv.Stop()
	select {
	case <-held.Done():
	case <-time.After(ttl + 5*time.Second):
		t.Fatal("lease not lost after Redis died")
	}
	lostAfter := time.Since(sent)
	require.ErrorIs(t, held.Err(), ownership.ErrLeaseLost)
	require.Zero(t, renewedOK(), "a renewal got through before Redis died")
	require.GreaterOrEqual(t, lostAfter, ttl-ownership.SafetyMargin(ttl), "lost before the trust deadline")
	require.Less(t, lostAfter, ttl+2*time.Second, "holder kept trusting the lease long past the TTL")

	_, err = a.Acquire(ctx, "job", 0)
	require.ErrorIs(t, err, ownership.ErrUnavailable, "fail closed while Redis is down")

	srv.Start()
	var again ownership.Lease
	require.Eventually(t, func() bool {
		again, err = a.Acquire(ctx, "job", 0)
		return err == nil
	}, 15*time.Second, 50*time.Millisecond, "acquire after restart")
	base := renewedOK()
	require.Eventually(t, func() bool { return renewedOK() >= base+3 }, 30*time.Second, 20*time.Millisecond,
		"renewals after the restart (lease: %v)", again.Err())
	require.NoError(t, again.Err(), "renewal did not survive the restart")
	require.NoError(t, again.Release(ctx))

	// Both Lockers' subscriptions are back.
	admin := srv.Client(t)
	require.Eventually(t, func() bool { return subscribers(t, admin) == 2 }, 15*time.Second, 20*time.Millisecond)
	// A 30s lease: without the release message the waiter would sleep on
	// the TTL; with it, it wakes at once.
	long, err := a.Acquire(ctx, "job", 30*time.Second)
	require.NoError(t, err)
	start := time.Now()
	got := acquireAndRelease(ctx, b, "job")
	time.AfterFunc(100*time.Millisecond, func() { _ = long.Release(ctx) })
	require.NoError(t, <-got)
	require.Less(t, time.Since(start), 10*time.Second, "the waiter slept on the TTL: no release message")
}

// countRenewals counts renew-script commands for lockKey sent by a client.
type countRenewals struct {
	lockKey string
	n       atomic.Int64
}

func (c *countRenewals) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *countRenewals) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.see(cmd); return next(ctx, cmd) }
}
func (c *countRenewals) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.see(cmd)
		}
		return next(ctx, cmds)
	}
}

// see counts EVAL/EVALSHA calls with 1 key and 3 args on lockKey (the renew
// script's shape: acquire and release take 4 keys, the holds script 4 args).
func (c *countRenewals) see(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) == 7 && (strings.EqualFold(str(args[0]), "evalsha") || strings.EqualFold(str(args[0]), "eval")) &&
		str(args[2]) == "1" && str(args[3]) == c.lockKey {
		c.n.Add(1)
	}
}

func str(v any) string { return fmt.Sprint(v) }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// After Release, no renewal of that lock reaches Redis (Redisson leaks
// them), while renewals of other leases go on.
func TestNoRenewalAfterRelease(t *testing.T) {
	t.Parallel()
	// Renewed every 500ms: a busy machine does not stall a renewal for the
	// ~900ms it would take to lose a lease and stop the rounds early.
	const ttl = 1500 * time.Millisecond
	env := testenv.Redis(t)
	client, err := redislock.NewClient(env.URL, redislock.ModeSingle)
	require.NoError(t, err)
	defer client.Close()
	released := &countRenewals{lockKey: env.Prefix + ":{gone}:lock"}
	kept := &countRenewals{lockKey: env.Prefix + ":{kept}:lock"}
	client.AddHook(released)
	client.AddHook(kept)
	l, err := redislock.New(client, redislock.Config{Prefix: env.Prefix, Owner: "a", WatchdogTimeout: ttl})
	require.NoError(t, err)
	defer l.Close()
	ctx := context.Background()

	other, err := l.Acquire(ctx, "kept", 0)
	require.NoError(t, err)
	le, err := l.Acquire(ctx, "gone", 0)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return released.n.Load() >= 2 }, 30*time.Second, 5*time.Millisecond, "renewals before release")
	require.NoError(t, le.Release(ctx))
	after := released.n.Load()
	base := kept.n.Load()
	require.Eventually(t, func() bool { return kept.n.Load() >= base+3 }, 30*time.Second, 5*time.Millisecond, "renewal rounds go on")
	require.Equal(t, after, released.n.Load(), "a renewal of a released lease reached Redis")
	require.NoError(t, other.Release(ctx))
}

// One Locker keeps one subscription (its wake channel) however many keys it
// waits on.
func TestOneSubscriptionPerLocker(t *testing.T) {
	t.Parallel()
	srv := startThrowaway(t)
	ctx := context.Background()
	holder := newLocker(t, srv.URL(), redislock.ModeSingle, "sub", ownershiptest.Options{Owner: "h", WaitTime: time.Second, WatchdogTimeout: 5 * time.Second})
	waiter := newLocker(t, srv.URL(), redislock.ModeSingle, "sub", ownershiptest.Options{Owner: "w", WaitTime: 10 * time.Second, WatchdogTimeout: 5 * time.Second})
	const keys = 50
	var leases []ownership.Lease
	for i := range keys {
		le, err := holder.Acquire(ctx, "k"+itoa(int64(i)), 0)
		require.NoError(t, err)
		leases = append(leases, le)
	}
	var wg sync.WaitGroup
	errs := make(chan error, keys)
	for i := range keys {
		wg.Go(func() {
			le, err := waiter.Acquire(ctx, "k"+itoa(int64(i)), 0)
			if err == nil {
				err = le.Release(ctx)
			}
			errs <- err
		})
	}
	admin := srv.Client(t)
	// Wait until all waiters are blocked (each has asked once: the key's
	// hash is untouched, so count clients instead), then count subscribers.
	require.Eventually(t, func() bool {
		n, err := admin.Exists(ctx, "sub:{k0}:lock").Result() // still held: waiters are waiting
		return err == nil && n == 1 && subscribers(t, admin) == 2
	}, 15*time.Second, 10*time.Millisecond)
	list, err := admin.ClientList(ctx).Result()
	require.NoError(t, err)
	require.Equal(t, 2, subscribers(t, admin), "one subscription (its wake channel) per Locker, not per lock:\n%s", list)
	require.Equal(t, 0, strings.Count(list, " psub=1 "), "no pattern subscriptions:\n%s", list)
	for _, le := range leases {
		require.NoError(t, le.Release(ctx))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// subscribers counts the connections subscribed to exactly one channel.
func subscribers(t *testing.T, admin *redis.Client) int {
	list, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		return -1
	}
	return strings.Count(list, " sub=1 ")
}

func TestParseOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, url, mode string
		check           func(t *testing.T, o *redis.UniversalOptions)
		wantErr         string
	}{
		{name: "single", url: "redis://:pw@127.0.0.1:6379/2", mode: "single", check: func(t *testing.T, o *redis.UniversalOptions) {
			require.Equal(t, []string{"127.0.0.1:6379"}, o.Addrs)
			require.Equal(t, "pw", o.Password)
			require.Equal(t, 2, o.DB)
			require.Equal(t, redislock.DefaultDialTimeout, o.DialTimeout)
			require.False(t, o.IsClusterMode)
			require.Nil(t, o.TLSConfig)
		}},
		{name: "single tls options", url: "rediss://user:pw@cache.internal:6380?dial_timeout=250ms&pool_size=7", mode: "single", check: func(t *testing.T, o *redis.UniversalOptions) {
			require.Equal(t, "user", o.Username)
			require.Equal(t, 250*time.Millisecond, o.DialTimeout)
			require.Equal(t, 7, o.PoolSize)
			require.NotNil(t, o.TLSConfig)
			require.Equal(t, "cache.internal", o.TLSConfig.ServerName)
		}},
		{name: "sentinel", url: "redis://:sentinelpw@10.0.0.1:26379/0?master_name=locks&addr=10.0.0.2:26379&password=secret", mode: "sentinel", check: func(t *testing.T, o *redis.UniversalOptions) {
			require.Equal(t, []string{"10.0.0.1:26379", "10.0.0.2:26379"}, o.Addrs)
			require.Equal(t, "locks", o.MasterName)
			require.Equal(t, "secret", o.Password)
			require.Equal(t, "sentinelpw", o.SentinelPassword)
			c := redis.NewUniversalClient(o)
			defer c.Close()
			_, isFailover := c.(*redis.Client) // sentinel-backed failover clients are *redis.Client
			require.True(t, isFailover)
		}},
		{name: "sentinel tls", url: "rediss://10.0.0.1:26379?master_name=locks", mode: "sentinel", check: func(t *testing.T, o *redis.UniversalOptions) {
			require.NotNil(t, o.TLSConfig)
			require.Empty(t, o.TLSConfig.ServerName, "each node is verified under the name it is dialled by")
		}},
		{name: "cluster", url: "redis://127.0.0.1:17001?addr=127.0.0.1:17002", mode: "cluster", check: func(t *testing.T, o *redis.UniversalOptions) {
			require.Equal(t, []string{"127.0.0.1:17001", "127.0.0.1:17002"}, o.Addrs)
			require.True(t, o.IsClusterMode)
			c := redis.NewUniversalClient(o)
			defer c.Close()
			_, isCluster := c.(*redis.ClusterClient)
			require.True(t, isCluster)
		}},
		{name: "cluster one seed", url: "redis://127.0.0.1:17001", mode: "cluster", check: func(t *testing.T, o *redis.UniversalOptions) {
			require.True(t, o.IsClusterMode)
		}},
		{name: "default port", url: "redis://host", mode: "single", check: func(t *testing.T, o *redis.UniversalOptions) {
			require.Equal(t, []string{"host:6379"}, o.Addrs)
		}},
		{name: "sentinel without master", url: "redis://10.0.0.1:26379", mode: "sentinel", wantErr: "master_name"},
		{name: "sentinel to replicas", url: "redis://10.0.0.1:26379?master_name=m&replica_only=true", mode: "sentinel", wantErr: "away from the master"},
		{name: "cluster read only", url: "redis://a:1?read_only=true", mode: "cluster", wantErr: "away from the masters"},
		{name: "single with two hosts", url: "redis://a:1,b:2", mode: "single", wantErr: "one host"},
		{name: "old comma list", url: "redis://a:1,b:2", mode: "cluster", wantErr: "?addr="},
		{name: "cluster db", url: "redis://a:1/3?addr=b:2", mode: "cluster", wantErr: "database 0"},
		{name: "bad scheme", url: "http://a:1", mode: "single", wantErr: "scheme"},
		{name: "unknown option", url: "redis://a:1?frobnicate=hunter2", mode: "single", wantErr: "unknown option frobnicate"},
		{name: "bad option value", url: "redis://a:1?dial_timeout=hunter2", mode: "single", wantErr: "invalid dial_timeout duration"},
		{name: "bad mode", url: "redis://a:1", mode: "ring", wantErr: "mode"},
		{name: "password redacted", url: "redis://:hunter2@a:1/x", mode: "single", wantErr: "REDACTED"},
		{name: "unparsable password not echoed", url: "redis://:hunter2%zz@a:1/0", mode: "single", wantErr: "percent-encode"},
		{name: "sentinel password redacted", url: "redis://:hunter2@a:1/0?master_name=m&password=hunter2&frobnicate=1", mode: "sentinel", wantErr: "REDACTED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := redislock.ParseOptions(tc.url, tc.mode)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				require.NotContains(t, err.Error(), "hunter2")
				return
			}
			require.NoError(t, err)
			tc.check(t, o)
		})
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	_, err := redislock.New(c, redislock.Config{})
	require.ErrorContains(t, err, "Owner")
	_, err = redislock.New(c, redislock.Config{Owner: "a", Prefix: "x{y}"})
	require.ErrorContains(t, err, "Prefix")
	_, err = redislock.New(c, redislock.Config{Owner: "a", WatchdogTimeout: time.Millisecond})
	require.ErrorContains(t, err, "WatchdogTimeout")
}

// A Redis whose eviction policy can evict lock keys (maxmemory set, any
// policy but noeviction) is refused: Acquire fails closed, naming the
// setting, because an evicted lock lets a second holder in.
func TestEvictingRedisIsRefused(t *testing.T) {
	t.Parallel()
	for policy, refused := range map[string]bool{"allkeys-lru": true, "volatile-ttl": true, "noeviction": false} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			srv := testenv.StartRedisServerWith(t, testenv.RedisServerOptions{Args: []string{"--maxmemory", "64mb", "--maxmemory-policy", policy}})
			l := newLocker(t, srv.URL(), redislock.ModeSingle, "ev", ownershipOptions("a", time.Second, 3*time.Second))
			le, err := l.Acquire(context.Background(), "k", 0)
			if !refused {
				require.NoError(t, err)
				require.NoError(t, le.Release(context.Background()))
				return
			}
			require.ErrorIs(t, err, ownership.ErrUnavailable)
			require.ErrorIs(t, err, redislock.ErrUnsafeEviction)
			require.ErrorContains(t, err, "maxmemory-policy "+policy)
			n, err := srv.Client(t).Exists(context.Background(), "ev:{k}:lock").Result()
			require.NoError(t, err)
			require.Zero(t, n, "nothing was written")
		})
	}
}

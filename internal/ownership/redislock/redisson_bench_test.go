package redislock_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// BenchmarkRedissonHandoff measures, in the redisson layout on a
// redis-server of its own, how long a waiter takes to get a lock after its
// holder let go, in the four pairings of a mixed fleet, side by side:
// Redisson -> Locker (unlock() wakes the Locker on Redisson's channel),
// Locker -> Redisson (the release publishes Redisson's unlock message),
// Locker -> Locker and Redisson -> Redisson (each side's own hand-off, for
// reference). One op is one hand-off; the waiter is asleep when the holder
// lets go (it has asked, subscribed and asked again). The latency runs
// from just before the release call to the waiter's acquisition, on the
// wall clock of this one machine: p50 and p99 are reported as µs-p50 and
// µs-p99. docs/lock.md and BENCHMARKS.md quote them.
//
//	go test -run '^$' -bench RedissonHandoff -benchtime 200x ./internal/ownership/redislock/
func BenchmarkRedissonHandoff(b *testing.B) {
	versions := testenv.RedissonVersions(b)
	srv := testenv.StartRedisServer(b)
	admin := srv.Client(b)
	url := srv.URL()
	target := testenv.RedissonTarget{URL: "redis://" + srv.Addr()}
	newL := func(owner string) *redislock.Locker {
		return newLayoutLocker(b, url, redislock.ModeSingle, "hb", redislock.LayoutRedisson, ownershipOptions(owner, 30*time.Second, 30*time.Second))
	}
	for _, version := range versions {
		java := testenv.StartRedisson(b, version, target, 30*time.Second)
		holderLocker, waiterLocker := newL("holder"), newL("waiter")
		ctx := context.Background()

		type side struct {
			name    string
			hold    func(key string)
			release func(key string) time.Time // returns when the release was started
		}
		var held ownership.Lease
		locker := side{
			name: "locker",
			hold: func(key string) {
				var err error
				held, err = holderLocker.Acquire(ctx, key, 0)
				require.NoError(b, err)
			},
			release: func(string) time.Time {
				at := time.Now()
				require.NoError(b, held.Release(ctx))
				return at
			},
		}
		redisson := side{
			name: "redisson",
			hold: func(key string) { require.NoError(b, java.Do("h", "lock", key, "0").Err) },
			release: func(key string) time.Time {
				r := java.Do("h", "unlock", key)
				require.NoError(b, r.Err)
				return r.Micros(1)
			},
		}
		lockerWaiter := func(b *testing.B, key string) (func() bool, func() time.Time) {
			got := make(chan time.Time, 1)
			go func() {
				le, err := waiterLocker.Acquire(ctx, key, 0)
				at := time.Now()
				if err == nil {
					err = le.Release(ctx)
				}
				if err != nil {
					b.Error(err)
				}
				got <- at
			}()
			return func() bool { return redisSubscribers(b, admin, key) > 0 }, func() time.Time { return <-got }
		}
		redissonWaiter := func(b *testing.B, key string) (func() bool, func() time.Time) {
			reply := java.Go("w", "trylock", key, "30000", "0")
			return func() bool { return redisSubscribers(b, admin, key) > 0 }, func() time.Time {
				r := <-reply
				require.NoError(b, r.Err)
				require.Equal(b, "true", r.Words[0])
				require.NoError(b, java.Do("w", "unlock", key).Err)
				return r.Micros(1)
			}
		}
		for _, pair := range []struct {
			holder side
			waiter func(*testing.B, string) (func() bool, func() time.Time)
			name   string
		}{
			{redisson, lockerWaiter, "redisson->locker"},
			{locker, redissonWaiter, "locker->redisson"},
			{locker, lockerWaiter, "locker->locker"},
			{redisson, redissonWaiter, "redisson->redisson"},
		} {
			b.Run("redisson="+version+"/"+pair.name, func(b *testing.B) {
				lat := make([]time.Duration, 0, b.N)
				for i := 0; i < b.N; i++ {
					key := mixedKey("bench")
					pair.holder.hold(key)
					asleep, got := pair.waiter(b, key)
					require.Eventually(b, asleep, 20*time.Second, time.Millisecond)
					// The waiter's second ask follows its subscription within
					// a round trip or two; let it go back to sleep.
					time.Sleep(20 * time.Millisecond)
					released := pair.holder.release(key)
					lat = append(lat, got().Sub(released))
				}
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "µs-p50")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "µs-p99")
			})
		}
	}
}

// redisSubscribers counts the subscriptions to Redisson's unlock channel
// of key.
func redisSubscribers(b *testing.B, admin *redis.Client, key string) int64 {
	ch := "redisson_lock__channel:{" + key + "}"
	m, err := admin.PubSubNumSub(context.Background(), ch).Result()
	require.NoError(b, err)
	return m[ch]
}

package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/ownershiptest"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// In the redisson layout the lock is a bare name, and a name may hold a
// hash that is no lock and has no TTL (a Redisson RMap, an application's
// hash). A waiter sees it held by someone else, as it must, and waits
// within its budget; it must not ask Redis every millisecond meanwhile (a
// PTTL of -1 is not "just vanished": it will not go away by itself).
func TestRedissonLayoutWaitForAHashWithoutTTLDoesNotSpin(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	ctx := context.Background()
	key := env.Prefix + ":map"
	require.NoError(t, env.Client.HSet(ctx, key, "some-field", "v").Err())
	client, err := redislock.NewClient(env.URL, redislock.ModeSingle)
	require.NoError(t, err)
	h := &evalCounter{key: key}
	client.AddHook(h)
	l, err := redislock.New(client, redislock.Config{Prefix: env.Prefix, Owner: "w", WaitTime: 1500 * time.Millisecond,
		WatchdogTimeout: 30 * time.Second, Layout: redislock.LayoutRedisson})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = l.Close()
		_ = client.Close()
	})
	_, err = l.Acquire(ctx, key, 0)
	require.ErrorIs(t, err, ownership.ErrAlreadyOwned)
	// An ask at the start, one after the subscription is confirmed, one
	// per poll (a second): a handful, not one per millisecond.
	require.LessOrEqual(t, h.n.Load(), int64(6), "the waiter asked Redis %d times in 1.5s", h.n.Load())
	v, err := env.Client.HGetAll(ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, map[string]string{"some-field": "v"}, v, "the waiter wrote into a hash that is not its lock")
}

// Redisson threads and coordinator Lockers (clients of their own) contend
// for one name, round after round: every holder appends "start" and "end"
// to one journal while it holds, and no two holds overlap. The Lockers
// start once a Redisson thread holds the name, so that the two sides
// contend (a coordinator hand-off goes to a waiting Locker first, so the
// Redisson threads finish after them).
func noOverlapUnderContention(t *testing.T, w *mixedWorld) {
	const lockers, redissons, rounds = 3, 3, 8
	ctx := context.Background()
	key := mixedKey("contended")
	journal := filepath.Join(t.TempDir(), "journal")
	appendLine := func(line string) error {
		f, err := os.OpenFile(journal, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		_, err = f.WriteString(line + "\n")
		return errors.Join(err, f.Close())
	}
	var wg sync.WaitGroup
	errs := make(chan error, lockers+redissons)
	redissonHolds := make(chan struct{})
	var once sync.Once
	for i := range redissons {
		worker := "r" + strconv.Itoa(i)
		wg.Go(func() {
			for r := range rounds {
				for _, cmd := range [][]string{
					{"lock", key, "0"}, {"append", journal, "start", worker}, {"append", journal, "end", worker}, {"unlock", key},
				} {
					var rep testenv.RedissonReply
					select {
					case rep = <-w.java.Go(worker, cmd...):
					case <-time.After(time.Minute):
						rep.Err = errors.New("no reply within a minute")
					}
					if rep.Err != nil {
						errs <- fmt.Errorf("redisson %s round %d %s: %w", worker, r, cmd[0], rep.Err)
						return
					}
					if cmd[0] == "append" {
						once.Do(func() { close(redissonHolds) })
					}
				}
			}
		})
	}
	select {
	case <-redissonHolds:
	case <-time.After(time.Minute):
		t.Fatal("no Redisson thread got the lock")
	}
	for i := range lockers {
		l := w.locker(t, "c"+strconv.Itoa(i), time.Minute)
		who := "c" + strconv.Itoa(i)
		wg.Go(func() {
			for r := range rounds {
				le, err := l.Acquire(ctx, key, 0)
				if err != nil {
					errs <- fmt.Errorf("locker %d round %d: %w", i, r, err)
					return
				}
				err = appendLine("start " + who)
				// About as long as a Redisson thread's hold (two round
				// trips to its JVM), so that a second holder would show.
				time.Sleep(2 * time.Millisecond)
				err = errors.Join(err, appendLine("end "+who), le.Release(ctx))
				if err != nil {
					errs <- fmt.Errorf("locker %d round %d: %w", i, r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	raw, err := os.ReadFile(journal)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	require.Len(t, lines, 2*rounds*(lockers+redissons))
	holder, last, crossings := "", "", 0
	for i, line := range lines {
		what, who, _ := strings.Cut(line, " ")
		switch what {
		case "start":
			require.Emptyf(t, holder, "line %d %q: %s still holds (overlap)", i+1, line, holder)
			holder = who
			if last != "" && last[0] != who[0] {
				crossings++
			}
		case "end":
			require.Equalf(t, holder, who, "line %d %q", i+1, line)
			holder, last = "", who
		default:
			t.Fatalf("journal line %d: %q", i+1, line)
		}
	}
	t.Logf("%d holds, %d of them right after the other side's", len(lines)/2, crossings)
}

// Redisson unlocks right after the waiting Locker's first answer ("held"),
// before the Locker listens on Redisson's channel: the message is gone. The
// Locker asks again once its subscription is confirmed (both of them on a
// cluster), so it gets the lock at once, not at its poll or the TTL.
func unlockBeforeTheWaiterSubscribes(t *testing.T, w *mixedWorld) {
	ctx := context.Background()
	key := mixedKey("window")
	require.NoError(t, w.java.Do("u", "lock", key, "0").Err)
	h := &orderHook{before: map[string]func(){}, after: map[string]func(){}}
	unlocked := make(chan RedissonUnlock, 1)
	h.after["acquire"] = func() {
		rep := w.java.Do("u", "unlock", key)
		unlocked <- RedissonUnlock{rep.Err, time.Now()}
	}
	client := w.hookedClient(t, h)
	l, err := redislock.New(client, redislock.Config{Prefix: w.prefix, Owner: "window", WaitTime: time.Minute,
		WatchdogTimeout: 30 * time.Second, Layout: redislock.LayoutRedisson})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = l.Close()
		_ = client.Close()
	})
	redislock.SetPoll(l, time.Minute) // only a wake-up can end the wait in time
	got := make(chan error, 1)
	go func() {
		le, err := l.Acquire(ctx, key, 0)
		if err == nil {
			err = le.Release(ctx)
		}
		got <- err
	}()
	var u RedissonUnlock
	select {
	case u = <-unlocked:
		require.NoError(t, u.err)
	case <-time.After(time.Minute):
		t.Fatal("the Locker never asked")
	}
	select {
	case err := <-got:
		require.NoError(t, err)
		t.Logf("unlocked before the subscription -> acquired %s later", time.Since(u.at))
	case <-time.After(20 * time.Second):
		t.Fatal("an unlock before the subscription left the Locker waiting (Redisson's watchdog TTL is 30s)")
	}
}

// RedissonUnlock is when an unlock the test sent was answered.
type RedissonUnlock struct {
	err error
	at  time.Time
}

// Fences rise across a change of layout (both layouts keep the same fence
// key) and across the fence key's loss in the redisson layout.
func TestFencesRiseAcrossALayoutSwitch(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	ctx := context.Background()
	key := env.Prefix + ":switch"
	var last int64
	next := func(layout redislock.Layout, what string) {
		t.Helper()
		l := newLayoutLocker(t, env.URL, redislock.ModeSingle, env.Prefix, layout, ownershipOptions("a", time.Second, 3*time.Second))
		le, err := l.Acquire(ctx, key, 0)
		require.NoError(t, err, what)
		require.Greater(t, le.Fence(), last, "fence went back %s", what)
		last = le.Fence()
		require.NoError(t, le.Release(ctx))
	}
	next(redislock.LayoutCoordinator, "at first")
	next(redislock.LayoutRedisson, "after the switch to the redisson layout")
	next(redislock.LayoutRedisson, "on a second acquisition")
	// A fence far ahead of the clock, then the fence key lost.
	require.NoError(t, env.Client.Set(ctx, env.Prefix+":{"+key+"}:fence", last+int64(time.Hour/time.Microsecond), 0).Err())
	next(redislock.LayoutRedisson, "past a fence ahead of the clock")
	next(redislock.LayoutCoordinator, "after the switch back")
	require.NoError(t, env.Client.Del(ctx, env.Prefix+":{"+key+"}:fence").Err())
	last -= int64(time.Hour / time.Microsecond) // lost with the key: only Redis TIME is left
	next(redislock.LayoutRedisson, "after the fence key was lost")
}

// A name that holds something other than a hash (a Redisson RBucket, an
// application's string) is no lock anybody can take: the Locker fails
// closed (unavailable, Redis' WRONGTYPE named), writes nothing, and does not
// mistake it for a free lock.
func TestRedissonLayoutKeyOfAnotherType(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	ctx := context.Background()
	key := env.Prefix + ":bucket"
	require.NoError(t, env.Client.Set(ctx, key, "not a lock", 0).Err())
	l := newLayoutLocker(t, env.URL, redislock.ModeSingle, env.Prefix, redislock.LayoutRedisson, ownershipOptions("a", 300*time.Millisecond, 3*time.Second))
	_, err := l.Acquire(ctx, key, 0)
	require.ErrorIs(t, err, ownership.ErrUnavailable)
	require.ErrorContains(t, err, "WRONGTYPE")
	v, err := env.Client.Get(ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, "not a lock", v)
	n, err := env.Client.Exists(ctx, env.Prefix+":{"+key+"}:fence", env.Prefix+":{"+key+"}:queue").Result()
	require.NoError(t, err)
	require.Zero(t, n, "a failed acquire wrote the fence or the queue")
}

// On the cluster, every script of the redisson layout runs in one slot
// whatever the key's characters (a CROSSSLOT error would fail it): acquire,
// queue, reentry, the release that hands off and publishes on Redisson's
// channel (PUBLISH and SPUBLISH), leave, and the listing.
func TestRedissonLayoutClusterSlotsOfEveryKey(t *testing.T) {
	t.Parallel()
	url, prefix, _ := clusterEnv(t)
	ctx := context.Background()
	a := newLayoutLocker(t, url, redislock.ModeCluster, prefix, redislock.LayoutRedisson, ownershipOptions("a", 10*time.Second, 300*time.Millisecond))
	b := newLayoutLocker(t, url, redislock.ModeCluster, prefix, redislock.LayoutRedisson, ownershipOptions("b", 10*time.Second, 300*time.Millisecond))
	quitter := newLayoutLocker(t, url, redislock.ModeCluster, prefix, redislock.LayoutRedisson, ownershipOptions("q", 200*time.Millisecond, 300*time.Millisecond))
	for _, name := range []string{"billrun:2026-11", "msisdn-reaper:sweep", "a/b.c_d-e:F", "x", "--", "..:://"} {
		key := prefix + ":" + name
		held, err := a.Acquire(ctx, key, 0)
		require.NoError(t, err, name)
		inner, err := a.Acquire(held.Context(), key, 0)
		require.NoError(t, err, name)
		_, err = quitter.Acquire(ctx, key, 0) // queues, gives up, leaves
		require.ErrorIs(t, err, ownership.ErrAlreadyOwned, name)
		got := make(chan error, 1)
		go func() {
			le, err := b.Acquire(ctx, key, 0)
			if err == nil {
				err = le.Release(ctx)
			}
			got <- err
		}()
		require.Eventually(t, func() bool {
			infos, err := a.Locks(ctx)
			require.NoError(t, err)
			for _, i := range infos {
				if i.Key == key && i.Owner == "a" && i.Holds == 2 {
					return true
				}
			}
			return false
		}, 10*time.Second, 50*time.Millisecond, name)
		require.NoError(t, inner.Release(ctx), name)
		require.NoError(t, held.Err(), name)
		require.NoError(t, held.Release(ctx), name)
		select {
		case err := <-got:
			require.NoError(t, err, name)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: b never got the lock", name)
		}
	}
}

// The redisson layout under docs/security.md's ACL with what that page
// says the layout adds: the lock names themselves (here ~*, "if the Redis
// is the locks' own") and Redisson's unlock channels. The whole conformance
// suite passes, and a waiter hears a Redisson unlock message under it.
func TestRedissonLayoutUnderTheDocumentedACL(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	ctx := context.Background()
	url := aclUser(t, env)
	opt, err := redis.ParseURL(url)
	require.NoError(t, err)
	require.NoError(t, env.Client.Do(ctx, "ACL", "SETUSER", opt.Username, "~*", "&redisson_lock__channel:*").Err())
	ownershiptest.Run(t, layoutBackend(url, redislock.ModeSingle, env.Prefix, redislock.LayoutRedisson, env.Client))

	// A Redisson holder's unlock message (as Redisson publishes it) wakes a
	// waiter of this user.
	key := env.Prefix + ":acl-redisson"
	require.NoError(t, env.Client.HSet(ctx, key, "client:1", "1").Err())
	require.NoError(t, env.Client.PExpire(ctx, key, time.Minute).Err())
	l := newLayoutLocker(t, url, redislock.ModeSingle, env.Prefix, redislock.LayoutRedisson, ownershipOptions("acl", 30*time.Second, 30*time.Second))
	redislock.SetPoll(l, time.Minute)
	got := acquireAndRelease(ctx, l, key)
	require.Eventually(t, func() bool {
		n, err := env.Client.PubSubNumSub(ctx, "redisson_lock__channel:{"+key+"}").Result()
		return err == nil && n["redisson_lock__channel:{"+key+"}"] > 0
	}, 10*time.Second, 5*time.Millisecond, "the waiter listens on Redisson's channel")
	require.NoError(t, env.Client.Del(ctx, key).Err())
	require.NoError(t, env.Client.Publish(ctx, "redisson_lock__channel:{"+key+"}", "0").Err())
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("the unlock message did not wake the waiter")
	}
}

package redislock_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// askHook signals each script call whose first key is lockKey: the waiter
// has asked Redis (and, having found the lock held, queued there).
type askHook struct {
	lockKey string
	asked   chan struct{}
}

func (h *askHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *askHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return asProcessHook(h.ProcessPipelineHook, next)
}
func (h *askHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			args := cmd.Args()
			if len(args) > 3 && (strings.EqualFold(str(args[0]), "evalsha") || strings.EqualFold(str(args[0]), "eval")) && str(args[3]) == h.lockKey {
				select {
				case h.asked <- struct{}{}:
				default:
				}
			}
		}
		return err
	}
}

// waitingLocker is a Locker with a client of its own (one process) whose
// script calls on key are signalled.
func waitingLocker(t *testing.T, layout redislock.Layout, url, prefix, owner, key string, wait time.Duration) (*redislock.Locker, *askHook) {
	t.Helper()
	client, err := redislock.NewClient(url, redislock.ModeSingle)
	require.NoError(t, err)
	h := &askHook{lockKey: lockKeyIn(layout, prefix, key), asked: make(chan struct{}, 64)}
	client.AddHook(h)
	l, err := redislock.New(client, redislock.Config{Prefix: prefix, Owner: owner, WaitTime: wait, WatchdogTimeout: 30 * time.Second, Layout: layout})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = l.Close()
		_ = client.Close()
	})
	return l, h
}

// acquireAndRelease takes key with l in the background (waiting as long as
// l's wait budget allows) and releases it at once; the error, or nil, comes
// on the channel.
func acquireAndRelease(ctx context.Context, l *redislock.Locker, key string) <-chan error {
	got := make(chan error, 1)
	go func() {
		le, err := l.Acquire(ctx, key, 0)
		if err == nil {
			err = le.Release(ctx)
		}
		got <- err
	}()
	return got
}

func waitAsked(t *testing.T, h *askHook, who string) {
	t.Helper()
	select {
	case <-h.asked:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s never asked Redis", who)
	}
}

// Waiters of different processes get the lock in the order they came, not
// in the order their wake-ups happen to arrive.
func TestWaitersAcrossProcessesAreServedInOrder(t *testing.T) {
	t.Parallel()
	forLayouts(t, waitersAcrossProcessesAreServedInOrder)
}

func waitersAcrossProcessesAreServedInOrder(t *testing.T, layout redislock.Layout) {
	const waiters = 6
	env := testenv.Redis(t)
	ctx := context.Background()
	key := keyIn(layout, env.Prefix, "fifo")
	holder := newLayoutLocker(t, env.URL, redislock.ModeSingle, env.Prefix, layout, ownershipOptions("holder", time.Second, 30*time.Second))
	held, err := holder.Acquire(ctx, key, 0)
	require.NoError(t, err)

	var mu sync.Mutex
	var order []int
	errs := make(chan error, waiters)
	for i := range waiters {
		l, h := waitingLocker(t, layout, env.URL, env.Prefix, "w"+strconv.Itoa(i), key, 30*time.Second)
		go func() {
			le, err := l.Acquire(ctx, key, 0)
			if err == nil {
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				err = le.Release(ctx)
			}
			errs <- err
		}()
		waitAsked(t, h, "waiter "+strconv.Itoa(i)) // queued before the next one comes
	}
	require.NoError(t, held.Release(ctx))
	for range waiters {
		require.NoError(t, <-errs)
	}
	require.Equal(t, []int{0, 1, 2, 3, 4, 5}, order, "served out of arrival order")
}

// wakeMonitor records every wake message under prefix.
func wakeMonitor(t *testing.T, env *testenv.RedisEnv) (msgs <-chan *redis.Message) {
	t.Helper()
	ps := env.Client.PSubscribe(context.Background(), env.Prefix+":wake:*")
	t.Cleanup(func() { _ = ps.Close() })
	_, err := ps.Receive(context.Background()) // the subscription confirmation
	require.NoError(t, err)
	return ps.Channel()
}

// A release wakes one waiting Locker, the oldest, through its own channel:
// one message, one subscriber, however many Lockers wait. A waiter that
// gives up leaves the queue, so the next release goes straight to the next
// one.
func TestReleaseWakesOneWaitingLocker(t *testing.T) {
	t.Parallel()
	forLayouts(t, releaseWakesOneWaitingLocker)
}

func releaseWakesOneWaitingLocker(t *testing.T, layout redislock.Layout) {
	env := testenv.Redis(t)
	ctx := context.Background()
	msgs := wakeMonitor(t, env)
	key := keyIn(layout, env.Prefix, "one")
	holder := newLayoutLocker(t, env.URL, redislock.ModeSingle, env.Prefix, layout, ownershipOptions("holder", time.Second, 30*time.Second))
	held, err := holder.Acquire(ctx, key, 0)
	require.NoError(t, err)

	// w0 gives up quickly; w1..w3 wait.
	quitter, qh := waitingLocker(t, layout, env.URL, env.Prefix, "w0", key, 300*time.Millisecond)
	gaveUp := make(chan error, 1)
	go func() { _, err := quitter.Acquire(ctx, key, 0); gaveUp <- err }()
	waitAsked(t, qh, "w0")
	type result struct {
		i  int
		le ownership.Lease
	}
	got := make(chan result, 3)
	for i := 1; i <= 3; i++ {
		l, h := waitingLocker(t, layout, env.URL, env.Prefix, "w"+strconv.Itoa(i), key, 30*time.Second)
		go func() {
			le, err := l.Acquire(ctx, key, 0)
			if err != nil {
				t.Errorf("w%d: %v", i, err)
				return
			}
			got <- result{i, le}
		}()
		waitAsked(t, h, "w"+strconv.Itoa(i))
	}
	require.ErrorIs(t, <-gaveUp, ownership.ErrAlreadyOwned)
	// w0 left the queue (its leave runs in the background): wait until the
	// queue holds w1..w3 only.
	require.Eventually(t, func() bool {
		n, err := env.Client.ZCard(ctx, env.Prefix+":{"+key+"}:queue").Result()
		return err == nil && n == 3
	}, 5*time.Second, 10*time.Millisecond)

	prev := held
	for want := 1; want <= 3; want++ {
		require.NoError(t, prev.Release(ctx))
		r := <-got
		require.Equal(t, want, r.i, "the lock went to a waiter that was not the oldest")
		select {
		case m := <-msgs:
			require.Contains(t, m.Channel, ":wake:w"+strconv.Itoa(want)+":", "woke the wrong Locker")
			require.Equal(t, key, m.Payload)
			n, err := env.Client.PubSubNumSub(ctx, m.Channel).Result()
			require.NoError(t, err)
			require.EqualValues(t, 1, n[m.Channel], "a wake channel has exactly one subscriber")
		case <-time.After(5 * time.Second):
			t.Fatal("no wake message")
		}
		select {
		case m := <-msgs:
			t.Fatalf("a second wake message for one release: %s", m.Channel)
		default:
		}
		prev = r.le
	}
	require.NoError(t, prev.Release(ctx))
}

// A waiting process dies (SIGKILL) at the head of the queue: the release
// reserves the lock for it, the reservation lapses, and the next waiter
// gets the lock within a ticket's life, not after its own wait budget or
// the holder's TTL.
func TestDeadWaiterDoesNotStarveTheQueue(t *testing.T) {
	t.Parallel()
	forLayouts(t, deadWaiterDoesNotStarveTheQueue)
}

func deadWaiterDoesNotStarveTheQueue(t *testing.T, layout redislock.Layout) {
	env := testenv.Redis(t)
	ctx := context.Background()
	key := keyIn(layout, env.Prefix, "dead")
	holder := newLayoutLocker(t, env.URL, redislock.ModeSingle, env.Prefix, layout, ownershipOptions("holder", time.Second, 30*time.Second))
	held, err := holder.Acquire(ctx, key, 0)
	require.NoError(t, err)

	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envHelper+"="+strings.Join([]string{env.URL, env.Prefix, key, "30s", "wait", string(layout)}, "|"))
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(stdout)
	require.True(t, lines.Scan(), "helper said nothing")
	require.Equal(t, "queued", lines.Text())

	live, h := waitingLocker(t, layout, env.URL, env.Prefix, "live", key, 20*time.Second)
	got := acquireAndRelease(ctx, live, key)
	waitAsked(t, h, "the live waiter")
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()

	start := time.Now()
	require.NoError(t, held.Release(ctx))
	select {
	case err := <-got:
		require.NoError(t, err)
		t.Logf("the waiter behind a dead one got the lock %s after the release", time.Since(start))
	case <-time.After(10 * time.Second):
		t.Fatal("a dead waiter starved the queue")
	}
}

// A waiter's caller gives up at the moment a wake (or the refresh timer)
// also fires; select then picks either at random. Either way the answer is
// "already owned, by b" (what the wait learned) and nothing is sent: an ask
// with a dead context would fail in the client and report "Redis
// unavailable", which Redis never was. Sixteen rounds: without the check
// before each ask, all sixteen pass with probability 2^-16.
func TestWaitEndingAsAWakeArrivesIsAlreadyOwned(t *testing.T) {
	t.Parallel()
	forLayouts(t, waitEndingAsAWakeArrivesIsAlreadyOwned)
}

func waitEndingAsAWakeArrivesIsAlreadyOwned(t *testing.T, layout redislock.Layout) {
	env, a, h := hookedLayoutLocker(t, layout)
	key := keyIn(layout, env.Prefix, "both")
	b := newLayoutLocker(t, env.URL, redislock.ModeSingle, env.Prefix, layout, ownershipOptions("b", 10*time.Second, 30*time.Second))
	held, err := b.Acquire(context.Background(), key, 0)
	require.NoError(t, err)
	for i := range 16 {
		ctx, cancel := context.WithCancel(context.Background())
		// After a's first ask (it found b's lock and queued), before a
		// reads the answer: the caller gives up and a wake arrives.
		h.mu.Lock()
		h.after["acquire"] = func() {
			cancel()
			redislock.WakeLocal(a, key)
		}
		h.mu.Unlock()
		_, err = a.Acquire(ctx, key, 0)
		cancel()
		require.ErrorIs(t, err, ownership.ErrAlreadyOwned, "round %d", i)
		require.ErrorIs(t, err, context.Canceled, "round %d", i)
		var ae *ownership.AcquireError
		require.ErrorAs(t, err, &ae)
		require.Equal(t, "b", ae.Owner, "round %d", i)
	}
	require.NoError(t, held.Err(), "b's lock is untouched")
	require.NoError(t, held.Release(context.Background()))
}

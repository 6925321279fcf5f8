package redislock_test

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// pipelineLog records the pipelines a client sends: for each, the lock
// scripts in it (by name) and its other commands (lower case).
// Single commands are not logged; an acquire sent alone is signalled on
// alone before it is sent.
type pipelineLog struct {
	mu    sync.Mutex
	sent  [][]string
	alone chan struct{}
}

func (h *pipelineLog) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *pipelineLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if redislock.ScriptName(cmd) == "acquire" {
			select {
			case h.alone <- struct{}{}:
			default:
			}
		}
		return next(ctx, cmd)
	}
}
func (h *pipelineLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var names []string
		for _, c := range cmds {
			if n := redislock.ScriptName(c); n != "" {
				names = append(names, n)
			} else {
				names = append(names, strings.ToLower(c.Name()))
			}
		}
		h.mu.Lock()
		h.sent = append(h.sent, names)
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

// largest is the pipeline with the most acquire scripts.
func (h *pipelineLog) largest() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var best []string
	for _, p := range h.sent {
		if count(p, "acquire") > count(best, "acquire") {
			best = p
		}
	}
	return best
}

func count(names []string, name string) int {
	n := 0
	for _, x := range names {
		if x == name {
			n++
		}
	}
	return n
}

// coalescing is a Locker on a throwaway server with DEBUG enabled, whose
// pipelines are logged, and which has asked Redis once (so that nothing
// of its own, such as its first INFO, waits behind a stall).
func coalescing(t *testing.T, srv *testenv.RedisServer, cfg redislock.Config, hooks ...redis.Hook) (*redislock.Locker, *pipelineLog) {
	t.Helper()
	client, err := redislock.NewClient(srv.URL(), redislock.ModeSingle)
	require.NoError(t, err)
	h := &pipelineLog{alone: make(chan struct{}, 64)}
	client.AddHook(h)
	for _, x := range hooks {
		client.AddHook(x)
	}
	cfg.Prefix, cfg.Owner = "co", "co"
	l, err := redislock.New(client, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = l.Close()
		_ = client.Close()
	})
	ctx := context.Background()
	// Until it holds: where a replica must acknowledge, a loaded machine
	// can keep the replica from answering within ReplicaTimeout (the
	// acquisition then fails closed); that is not what the tests test.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		le, err := l.Acquire(ctx, "warm", 0)
		require.NoError(c, err, "the warm-up acquisition")
		require.NoError(c, le.Release(ctx))
	}, 60*time.Second, 10*time.Millisecond)
	for len(h.alone) > 0 {
		<-h.alone
	}
	return l, h
}

// acquireAll starts an acquisition of each key and returns their results.
func acquireAll(ctx context.Context, l *redislock.Locker, keys []string) []<-chan acquired {
	out := make([]<-chan acquired, len(keys))
	for i, k := range keys {
		out[i] = acquireAsync(ctx, l, k, 0)
	}
	return out
}

func keysN(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	return keys
}

// Acquisitions that goroutines of one process start while the Locker's
// pipelines are busy (here: stuck in a stalled Redis) go out together, in
// one pipeline, and each gets its own lease.
func TestConcurrentAcquisitionsShareAPipeline(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServerWith(t, testenv.RedisServerOptions{Args: []string{"--enable-debug-command", "yes"}})
	l, log := coalescing(t, srv, redislock.Config{WaitTime: 30 * time.Second})
	ctx := context.Background()
	keys := keysN("k", 16)
	stalled := srv.Stall(t, 1500*time.Millisecond)
	got := acquireAll(ctx, l, keys)
	// Two go at once (each alone, stuck in the stall); the others queue.
	require.Eventually(t, func() bool { return redislock.Queued(l) == len(keys)-2 }, 10*time.Second, time.Millisecond,
		"the acquisitions queue behind the busy pipelines")
	<-stalled
	for i, ch := range got {
		r := <-ch
		require.NoError(t, r.err, keys[i])
		require.NoError(t, r.le.Release(ctx))
	}
	require.Equal(t, len(keys)-2, count(log.largest(), "acquire"), "the queued acquisitions went in one pipeline: %v", log.largest())
}

// Where replicas must acknowledge, a shared pipeline ends with one WAIT on
// its connection, which counts every acquisition in it: with the replica
// answering, each holds, and is on the replica; with the replica stopped,
// each fails closed and none is left on the master.
func TestPipelinedAcquisitionsAreEachAcknowledged(t *testing.T) {
	t.Parallel()
	master := testenv.StartRedisServerWith(t, testenv.RedisServerOptions{Args: []string{"--enable-debug-command", "yes"}})
	replica := testenv.StartRedisServerWith(t, testenv.RedisServerOptions{ReplicaOf: master.Addr()})
	admin, rc := master.Client(t), replica.Client(t)
	ctx := context.Background()
	require.Eventually(t, func() bool {
		info, err := admin.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "state=online")
	}, 30*time.Second, 10*time.Millisecond, "the replica is in sync")
	l, log := coalescing(t, master, redislock.Config{WaitTime: 30 * time.Second, WaitReplicas: 1, ReplicaTimeout: time.Second})

	keys := keysN("acked", 8)
	stalled := master.Stall(t, time.Second)
	got := acquireAll(ctx, l, keys)
	require.Eventually(t, func() bool { return redislock.Queued(l) == len(keys)-2 }, 10*time.Second, time.Millisecond)
	<-stalled
	var leases []ownership.Lease
	for i, ch := range got {
		r := <-ch
		require.NoError(t, r.err, keys[i])
		leases = append(leases, r.le)
	}
	p := log.largest()
	require.Equal(t, len(keys)-2, count(p, "acquire"), "%v", p)
	require.Equal(t, 1, count(p, "wait"), "one WAIT for the pipeline: %v", p)
	require.Equal(t, "wait", p[len(p)-1], "WAIT comes after the writes it counts: %v", p)
	for _, k := range keys {
		n, err := rc.Exists(ctx, "co:{"+k+"}:lock").Result()
		require.NoError(t, err)
		require.Equal(t, int64(1), n, "%s is on the replica", k)
	}
	for _, le := range leases {
		require.NoError(t, le.Release(ctx))
	}

	// The replica stops acknowledging: every acquisition in the shared
	// pipeline fails closed, and its lock on the master is deleted.
	replica.Pause()
	t.Cleanup(replica.Resume)
	keys = keysN("unacked", 8)
	stalled = master.Stall(t, time.Second)
	got = acquireAll(ctx, l, keys)
	require.Eventually(t, func() bool { return redislock.Queued(l) == len(keys)-2 }, 10*time.Second, time.Millisecond)
	<-stalled
	for i, ch := range got {
		r := <-ch
		require.ErrorIs(t, r.err, redislock.ErrUnreplicated, keys[i])
	}
	for _, k := range keys {
		require.Eventually(t, func() bool {
			n, err := admin.Exists(ctx, "co:{"+k+"}:lock").Result()
			return err == nil && n == 0
		}, 10*time.Second, 10*time.Millisecond, "the unreplicated lock on %s was left behind", k)
	}
}

// A call that waits in the queue leaves it when its context ends, and is
// never sent: its wait budget bounds it, however long the pipelines ahead
// of it take.
func TestQueuedAcquisitionLeavesOnItsContext(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServerWith(t, testenv.RedisServerOptions{Args: []string{"--enable-debug-command", "yes"}})
	l, log := coalescing(t, srv, redislock.Config{WaitTime: 30 * time.Second})
	ctx := context.Background()
	// Shorter than the read timeout: the busy acquisitions are not resent.
	stalled := srv.Stall(t, 1900*time.Millisecond)
	busy := acquireAll(ctx, l, []string{"busy0", "busy1"})
	for range busy { // both in flight, alone, stuck in the stall: the next call queues
		select {
		case <-log.alone:
		case <-time.After(10 * time.Second):
			t.Fatal("the busy acquisitions were not sent")
		}
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := l.Acquire(short, "late", 0)
	took := time.Since(start)
	require.ErrorIs(t, err, ownership.ErrUnavailable)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	// The bound is the behaviour: its context, not the stall.
	require.Less(t, took, 1500*time.Millisecond, "the queued acquisition waited for the pipelines ahead of it")
	<-stalled
	for i, ch := range busy {
		r := <-ch
		require.NoError(t, r.err, "busy%d", i)
		require.NoError(t, r.le.Release(ctx))
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	for _, p := range log.sent {
		require.Zero(t, count(p, "acquire"), "a queued acquisition left: nothing was pipelined: %v", p)
	}
}

// replyGate holds back the answer to the first command or pipeline that
// carries an acquisition of key: Redis runs it, its caller waits for the
// answer until the test opens the gate.
type replyGate struct {
	key  string // "{key}" as it appears in the lock's keys
	sent chan struct{}
	open chan struct{}
	once sync.Once
}

func newReplyGate(t *testing.T, key string) *replyGate {
	g := &replyGate{key: "{" + key + "}", sent: make(chan struct{}, 1), open: make(chan struct{})}
	t.Cleanup(g.release)
	return g
}

func (g *replyGate) release() { g.once.Do(func() { close(g.open) }) }

func (g *replyGate) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *replyGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return asProcessHook(g.ProcessPipelineHook, next)
}
func (g *replyGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if redislock.ScriptName(c) == "acquire" && strings.Contains(c.String(), g.key) {
				select {
				case g.sent <- struct{}{}:
				default:
				}
				<-g.open
				break
			}
		}
		return err
	}
}

// A caller whose acquisition a pipeline already carries, and whose context
// ends before the answer comes, returns at once, as a call sent alone
// returns when its context ends; the lock Redis made for it is deleted once
// the answer comes, so no lock is left that no caller knows of. The other
// acquisition in the same pipeline gets its lease.
func TestSentAcquisitionLeavesOnItsContext(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServerWith(t, testenv.RedisServerOptions{Args: []string{"--enable-debug-command", "yes"}})
	gate := newReplyGate(t, "gone")
	l, log := coalescing(t, srv, redislock.Config{WaitTime: 30 * time.Second}, gate)
	admin := srv.Client(t)
	ctx := context.Background()
	stalled := srv.Stall(t, 1500*time.Millisecond)
	busy := acquireAll(ctx, l, []string{"busy0", "busy1"})
	for range busy { // both in flight, alone, stuck in the stall: the next calls queue
		select {
		case <-log.alone:
		case <-time.After(10 * time.Second):
			t.Fatal("the busy acquisitions were not sent")
		}
	}
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	gone := acquireAsync(gctx, l, "gone", 0)
	require.Eventually(t, func() bool { return redislock.Queued(l) == 1 }, 10*time.Second, time.Millisecond)
	kept := acquireAsync(ctx, l, "kept", 0)
	require.Eventually(t, func() bool { return redislock.Queued(l) == 2 }, 10*time.Second, time.Millisecond)
	<-stalled
	select {
	case <-gate.sent: // Redis ran both; the answer is held
	case <-time.After(10 * time.Second):
		t.Fatal("the queued acquisitions were not sent")
	}
	n, err := admin.Exists(ctx, "co:{gone}:lock").Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "Redis made the lock")
	cancel()
	select {
	case r := <-gone:
		require.ErrorIs(t, r.err, ownership.ErrUnavailable)
		require.ErrorIs(t, r.err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("the caller waited for the answer after its context ended")
	}
	gate.release()
	require.Eventually(t, func() bool {
		n, err := admin.Exists(ctx, "co:{gone}:lock").Result()
		return err == nil && n == 0
	}, 10*time.Second, 10*time.Millisecond, "the lock of the caller that left was kept")
	r := <-kept
	require.NoError(t, r.err)
	require.NoError(t, r.le.Release(ctx))
	for i, ch := range busy {
		r := <-ch
		require.NoError(t, r.err, "busy%d", i)
		require.NoError(t, r.le.Release(ctx))
	}
}

// Close waits for the goroutines that send queued calls: none outlives it.
func TestCloseWaitsForPipelines(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServerWith(t, testenv.RedisServerOptions{Args: []string{"--enable-debug-command", "yes"}})
	gate := newReplyGate(t, "closing0")
	l, log := coalescing(t, srv, redislock.Config{WaitTime: 30 * time.Second}, gate)
	ctx := context.Background()
	stalled := srv.Stall(t, time.Second)
	busy := acquireAll(ctx, l, []string{"busy0", "busy1"})
	for range busy {
		select {
		case <-log.alone:
		case <-time.After(10 * time.Second):
			t.Fatal("the busy acquisitions were not sent")
		}
	}
	keys := keysN("closing", 4)
	got := acquireAll(ctx, l, keys)
	require.Eventually(t, func() bool { return redislock.Queued(l) == len(keys) }, 10*time.Second, time.Millisecond)
	<-stalled
	select {
	case <-gate.sent: // the queued pipeline is in flight, its answer held
	case <-time.After(10 * time.Second):
		t.Fatal("the queued acquisitions were not sent")
	}
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	require.Never(t, func() bool { return len(closed) > 0 }, 300*time.Millisecond, 10*time.Millisecond,
		"Close returned while a pipeline's sender was still running")
	gate.release()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return once the pipeline answered")
	}
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	require.NotContains(t, stacks, "redislock.(*Locker).flush", "a pipeline's sender outlived Close")
	for _, ch := range append(busy, got...) {
		<-ch // acquired before or while closing: either way answered
	}
}

// Close while the Locker's own pipelines are in flight (sent alone, on
// their callers' goroutines) and other calls queue behind them: no
// pipeline is sent after Close returns, the queued callers are told the
// Locker closed, and none of them leaves a lock in Redis for its TTL
// (before, the queued acquisitions were sent by a flusher that started
// after Close had returned, acquired, and their clean-up was dropped).
func TestCloseSendsNoQueuedCalls(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServerWith(t, testenv.RedisServerOptions{Args: []string{"--enable-debug-command", "yes"}})
	l, log := coalescing(t, srv, redislock.Config{WaitTime: 30 * time.Second})
	admin := srv.Client(t)
	ctx := context.Background()
	stalled := srv.Stall(t, 1500*time.Millisecond)
	busy := acquireAll(ctx, l, []string{"busy0", "busy1"})
	for range busy {
		select {
		case <-log.alone:
		case <-time.After(10 * time.Second):
			t.Fatal("the busy acquisitions were not sent")
		}
	}
	keys := keysN("queued", 3)
	got := acquireAll(ctx, l, keys)
	require.Eventually(t, func() bool { return redislock.Queued(l) == len(keys) }, 10*time.Second, time.Millisecond)
	require.NoError(t, l.Close())
	log.mu.Lock()
	before := len(log.sent)
	log.mu.Unlock()
	for i, ch := range got {
		select {
		case r := <-ch:
			require.ErrorIs(t, r.err, ownership.ErrUnavailable, "queued%d", i)
		case <-time.After(20 * time.Second):
			t.Fatalf("queued%d did not return after Close", i)
		}
	}
	<-stalled
	for _, ch := range busy {
		<-ch // sent before Close: acquired or not, either way answered
	}
	log.mu.Lock()
	after := log.sent[before:]
	log.mu.Unlock()
	require.Empty(t, after, "pipelines sent after Close returned")
	for _, k := range keys {
		n, err := admin.Exists(ctx, "co:{"+k+"}:lock").Result()
		require.NoError(t, err)
		require.Zero(t, n, "a lock of %s acquired after Close was left for its TTL", k)
	}
}

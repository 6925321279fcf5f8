package redislock_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership/ownershiptest"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// asProcessHook makes a pipeline hook see single commands too: the Locker
// sends a call that goes alone to its node as a plain command, and calls
// that go together as a pipeline.
func asProcessHook(hook func(redis.ProcessPipelineHook) redis.ProcessPipelineHook, next redis.ProcessHook) redis.ProcessHook {
	wrapped := hook(func(ctx context.Context, cmds []redis.Cmder) error { return next(ctx, cmds[0]) })
	return func(ctx context.Context, cmd redis.Cmder) error { return wrapped(ctx, []redis.Cmder{cmd}) }
}

// The crash test re-executes this test binary as a lock holder.
const (
	envHelper = "REDISLOCK_TEST_HOLDER" // url|prefix|key|watchdog timeout[|wait[|layout]]
)

// helperMain runs the test binary as a helper process when asked to: it
// takes a watchdog lease, prints "acquired <fence>" and blocks until killed.
// In wait mode (the key is held elsewhere) it prints "queued" once its first
// acquire attempt is answered, and goes on waiting until killed. It reports
// whether it ran.
func helperMain() bool {
	spec := os.Getenv(envHelper)
	if spec == "" {
		return false
	}
	parts := strings.Split(spec, "|")
	ttl, _ := time.ParseDuration(parts[3])
	client, err := redislock.NewClient(parts[0], redislock.ModeSingle)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	wait := 5 * time.Second
	layout := redislock.LayoutCoordinator
	if len(parts) > 5 {
		layout = redislock.Layout(parts[5])
	}
	if len(parts) > 4 && parts[4] == "wait" {
		wait = time.Minute
		h := &askHook{lockKey: lockKeyIn(layout, parts[1], parts[2]), asked: make(chan struct{}, 1)}
		client.AddHook(h)
		go func() { <-h.asked; fmt.Println("queued") }()
	}
	l, err := redislock.New(client, redislock.Config{Prefix: parts[1], Owner: "crashing-helper", WatchdogTimeout: ttl, WaitTime: wait, Layout: layout})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	le, err := l.Acquire(context.Background(), parts[2], 0)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	fmt.Println("acquired", le.Fence())
	<-le.Done()
	fmt.Println("lost", le.Err())
	os.Exit(3)
	return true
}

// A process holding a watchdog lease is SIGKILLed: nobody releases, nobody
// renews. Another process acquires after the TTL ran out (never before),
// and soon after (seconds, where its wait budget is a minute).
func TestCrashedHolder(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	env := testenv.Redis(t)
	key := "crash/" + testenv.UniqueName("k")
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envHelper+"="+strings.Join([]string{env.URL, env.Prefix, key, ttl.String()}, "|"))
	// The helper renews its lease until killed: it must die with us, even
	// when this test binary is killed before its cleanup runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(stdout)
	require.True(t, lines.Scan(), "helper said nothing")
	line := lines.Text()
	require.True(t, strings.HasPrefix(line, "acquired "), "helper: %s", line)
	fence, err := strconv.ParseInt(strings.TrimPrefix(line, "acquired "), 10, 64)
	require.NoError(t, err)

	// Watch the helper's watchdog renew once (PTTL falls, then jumps back)
	// before the crash.
	lockKey := env.Prefix + ":{" + key + "}:lock"
	ctx := context.Background()
	pttl := func() time.Duration { d, _ := env.Client.PTTL(ctx, lockKey).Result(); return d }
	require.Eventually(t, func() bool { d := pttl(); return d > 0 && d < ttl*8/10 }, 30*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return pttl() > ttl*9/10 }, 30*time.Second, 5*time.Millisecond, "no renewal seen")

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	pttlAtKill, err := env.Client.PTTL(ctx, lockKey).Result()
	require.NoError(t, err)
	require.Positive(t, pttlAtKill, "the crashed holder's lock must still exist")
	_ = cmd.Wait()

	// A minute's budget: a survivor that did not wake when the TTL ran out
	// would take far longer than the bound below.
	l := newLocker(t, env.URL, redislock.ModeSingle, env.Prefix, ownershiptest.Options{Owner: "survivor", WaitTime: time.Minute, WatchdogTimeout: ttl})
	le, err := l.Acquire(ctx, key, 0)
	require.NoError(t, err)
	took := time.Since(killed)
	require.Greater(t, le.Fence(), fence)
	require.GreaterOrEqual(t, took, pttlAtKill-5*time.Millisecond, "acquired before the crashed holder's TTL ran out")
	require.Less(t, took, ttl+5*time.Second, "the survivor did not take over when the TTL ran out")
	t.Logf("crashed holder's lock: pttl %s at kill; taken over %s after the kill", pttlAtKill, took)
	require.NoError(t, le.Release(ctx))
}

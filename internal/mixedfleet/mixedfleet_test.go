package mixedfleet_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { testenv.RemoveBinaries() }))
}

// fleet is one Redis (single or cluster), a Redisson process on it, and
// the environment `coordinator lock` runs with in the redisson layout.
type fleet struct {
	version string
	target  testenv.RedissonTarget
	java    *testenv.Redisson
	admin   redis.UniversalClient
	prefix  string
	env     []string
}

func newFleet(t *testing.T, version, mode string) *fleet {
	t.Helper()
	f := &fleet{version: version}
	var url string
	if mode == "cluster" {
		addrs := testenv.RedisClusterAddrs(t)
		f.target = testenv.RedissonTarget{Cluster: addrs}
		url = "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		t.Cleanup(func() { _ = cc.Close() })
		f.admin, f.prefix = cc, testenv.UniqueName("mf")
	} else {
		rd := testenv.Redis(t)
		url = rd.URL
		f.target = testenv.RedissonTarget{URL: strings.TrimSuffix(rd.URL, "/0")}
		f.admin, f.prefix = rd.Client, rd.Prefix
	}
	f.env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"COORDINATOR_LOCK_REDIS_URL=" + url, "COORDINATOR_LOCK_REDIS_MODE=" + mode,
		"COORDINATOR_LOCK_LAYOUT=redisson", "COORDINATOR_LOCK_KEY_PREFIX=" + f.prefix,
		"COORDINATOR_REPLICA_ID=cli-" + mode, "COORDINATOR_LOG_FORMAT=json",
	}
	f.java = testenv.StartRedisson(t, version, f.target, 30*time.Second)
	return f
}

// lockCmd is a running `coordinator lock`.
type lockCmd struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan struct{}
}

// lock starts `coordinator lock ARGS...` (lock's own flags, then -- and the
// command).
func (f *fleet) lock(t *testing.T, args ...string) *lockCmd {
	t.Helper()
	cmd := exec.Command(testenv.CoordinatorBinary(t), append([]string{"lock"}, args...)...)
	cmd.Env = f.env
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	c := &lockCmd{cmd: cmd, stderr: &stderr, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.done
	})
	return c
}

// exit waits (at most a minute) for the command and returns its exit code.
func (c *lockCmd) exit(t *testing.T) int {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(time.Minute):
		t.Fatalf("coordinator lock did not end: %s", c.stderr)
	}
	return c.cmd.ProcessState.ExitCode()
}

// queued: a coordinator waits for key (its Locker is in the key's queue).
func (f *fleet) queued(t *testing.T, key string) bool {
	n, err := f.admin.ZCard(context.Background(), f.prefix+":{"+key+"}:queue").Result()
	require.NoError(t, err)
	return n > 0
}

// subscribers counts the subscriptions to Redisson's unlock channel of key
// on every master.
func (f *fleet) subscribers(t *testing.T, key string) int64 {
	t.Helper()
	ch := "redisson_lock__channel:{" + key + "}"
	total := int64(0)
	count := func(ctx context.Context, c *redis.Client) (int64, error) {
		m, err := c.PubSubNumSub(ctx, ch).Result()
		if err != nil {
			return 0, err
		}
		s, err := c.PubSubShardNumSub(ctx, ch).Result()
		return m[ch] + s[ch], err
	}
	ctx := context.Background()
	if _, ok := f.admin.(*redis.ClusterClient); ok {
		for _, a := range testenv.RedisClusterAddrs(t) {
			c := redis.NewClient(&redis.Options{Addr: a})
			n, err := count(ctx, c)
			_ = c.Close()
			require.NoError(t, err)
			total += n
		}
		return total
	}
	n, err := count(ctx, f.admin.(*redis.Client))
	require.NoError(t, err)
	return n
}

func uniqueKey(name string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "billrun:mixed-" + name + "-" + hex.EncodeToString(b[:])
}

// journal is the file both sides append to while they hold the lock:
// "<who> start", then "<who> end" (or "<who> killed", written by the test
// once a holder is dead).
type journal string

func newJournal(t *testing.T) journal { return journal(filepath.Join(t.TempDir(), "journal")) }

// sh is a shell command line that appends "coordinator start", runs mid,
// and appends "coordinator end".
func (j journal) sh(mid string) []string {
	line := `echo "coordinator start" >> "$0"; ` + mid + `echo "coordinator end" >> "$0"`
	return []string{"--", "sh", "-c", line, string(j)}
}

func (j journal) lines(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(string(j))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	require.NoError(t, err)
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// requireNoOverlap checks the journal: every start comes while nobody
// holds, and is followed by the same holder's end (or death) before the
// next start; and the sequence of events is want.
func (j journal) requireNoOverlap(t *testing.T, want ...string) {
	t.Helper()
	lines := j.lines(t)
	holder := ""
	for i, l := range lines {
		who, ev, _ := strings.Cut(l, " ")
		switch ev {
		case "start":
			require.Emptyf(t, holder, "line %d %q: %s still holds (overlap): %q", i+1, l, holder, lines)
			holder = who
		case "end", "killed":
			require.Equalf(t, holder, who, "line %d %q: %q", i+1, l, lines)
			holder = ""
		default:
			t.Fatalf("journal line %d: %q", i+1, l)
		}
	}
	require.Empty(t, holder, "a holder never ended: %q", lines)
	require.Equal(t, want, lines)
}

func TestCoordinatorLockAndRedissonExcludeEachOther(t *testing.T) {
	t.Parallel()
	for _, version := range testenv.RedissonVersions(t) {
		for _, mode := range []string{"single", "cluster"} {
			t.Run(version+"/"+mode, func(t *testing.T) {
				t.Parallel()
				f := newFleet(t, version, mode)
				t.Run("RedissonHoldsCoordinatorLockRunsAfterUnlock", func(t *testing.T) {
					t.Parallel()
					redissonHolds(t, f)
				})
				t.Run("CoordinatorHoldsRedissonTryLockGetsItAfterRelease", func(t *testing.T) {
					t.Parallel()
					coordinatorHolds(t, f)
				})
				t.Run("ReentrantRedissonHoldsAndCoordinatorLocks", func(t *testing.T) {
					t.Parallel()
					reentrantRedisson(t, f)
				})
				t.Run("KilledRedissonHolder", func(t *testing.T) {
					t.Parallel()
					killedRedisson(t, f)
				})
			})
		}
	}
}

func redissonHolds(t *testing.T, f *fleet) {
	key, j := uniqueKey("a"), newJournal(t)
	require.NoError(t, f.java.Do("a", "lock", key, "0").Err)
	require.NoError(t, f.java.Do("a", "append", string(j), "redisson start").Err)
	c := f.lock(t, append([]string{"--key", key, "--wait", "40s"}, j.sh("")...)...)
	require.Eventually(t, func() bool { return f.queued(t, key) }, 30*time.Second, 5*time.Millisecond, "coordinator lock waits: %s", c.stderr)
	require.Empty(t, j.lines(t)[1:], "the command did not run while Redisson held the lock")
	require.NoError(t, f.java.Do("a", "append", string(j), "redisson end").Err)
	require.NoError(t, f.java.Do("a", "unlock", key).Err)
	require.Equal(t, 0, c.exit(t), "%s", c.stderr)
	j.requireNoOverlap(t, "redisson start", "redisson end", "coordinator start", "coordinator end")
}

func coordinatorHolds(t *testing.T, f *fleet) {
	key, j := uniqueKey("b"), newJournal(t)
	// The command holds the lock until the test writes to this FIFO.
	fifo := filepath.Join(t.TempDir(), "release")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	c := f.lock(t, append(append([]string{"--key", key}, j.sh(`read x < "$1"; `)...), fifo)...)
	require.Eventually(t, func() bool { return len(j.lines(t)) > 0 }, 30*time.Second, 5*time.Millisecond, "the command runs: %s", c.stderr)
	tried := f.java.Go("b", "trylock", key, "30000", "0")
	require.Eventually(t, func() bool { return f.subscribers(t, key) > 0 }, 30*time.Second, 5*time.Millisecond,
		"Redisson's tryLock waits on its unlock channel")
	select {
	case r := <-tried:
		t.Fatalf("Redisson took a lock coordinator lock holds: %v %v", r.Words, r.Err)
	default:
	}
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = w.WriteString("go\n")
	require.NoError(t, err)
	require.NoError(t, w.Close())
	select {
	case r := <-tried:
		require.NoError(t, r.Err)
		require.Equal(t, "true", r.Words[0], "Redisson's tryLock gets the lock once coordinator lock releases it")
	case <-time.After(40 * time.Second):
		t.Fatal("no answer from Redisson's tryLock")
	}
	require.NoError(t, f.java.Do("b", "append", string(j), "redisson start").Err)
	require.NoError(t, f.java.Do("b", "append", string(j), "redisson end").Err)
	require.NoError(t, f.java.Do("b", "unlock", key).Err)
	require.Equal(t, 0, c.exit(t), "%s", c.stderr)
	j.requireNoOverlap(t, "coordinator start", "coordinator end", "redisson start", "redisson end")
}

func reentrantRedisson(t *testing.T, f *fleet) {
	key := uniqueKey("c")
	// A replica locked the key once (coordinator locks lists such keys).
	require.Equal(t, 0, f.lock(t, "--key", key, "--", "true").exit(t))

	require.NoError(t, f.java.Do("c", "lock", key, "0").Err)
	require.NoError(t, f.java.Do("c", "lock", key, "0").Err)
	owner := f.java.Do("c", "owner")
	require.NoError(t, owner.Err)
	tryOnce := func() (int, string) {
		c := f.lock(t, "--key", key, "--wait", "0", "--", "true")
		code := c.exit(t)
		return code, c.stderr.String()
	}
	code, stderr := tryOnce()
	require.Equal(t, job.ExitAlreadyOwned, code, stderr)
	require.Contains(t, stderr, "already_owned")
	require.Contains(t, stderr, "redisson:"+owner.Words[0], "the owner named is the Redisson client and thread")

	// coordinator locks shows the Redisson holder.
	cmd := exec.Command(testenv.CoordinatorBinary(t), "locks", "--json")
	cmd.Env = f.env
	out, err := cmd.Output()
	require.NoError(t, err)
	var infos []ownership.LockInfo
	require.NoError(t, json.Unmarshal(out, &infos), "%s", out)
	found := false
	for _, i := range infos {
		if i.Key == key {
			found = true
			require.Equal(t, "redisson:"+owner.Words[0], i.Owner)
			require.Equal(t, int64(2), i.Holds)
			require.Zero(t, i.Fence)
		}
	}
	require.True(t, found, "%s", out)

	require.NoError(t, f.java.Do("c", "unlock", key).Err)
	code, stderr = tryOnce()
	require.Equal(t, job.ExitAlreadyOwned, code, "one of two Redisson holds released: still held: %s", stderr)
	require.NoError(t, f.java.Do("c", "unlock", key).Err)
	code, stderr = tryOnce()
	require.Equal(t, 0, code, "both Redisson holds released: %s", stderr)
}

func killedRedisson(t *testing.T, f *fleet) {
	key, j := uniqueKey("d"), newJournal(t)
	doomed := testenv.StartRedisson(t, f.version, f.target, 1500*time.Millisecond)
	require.NoError(t, doomed.Do("d", "lock", key, "0").Err)
	require.NoError(t, doomed.Do("d", "append", string(j), "redisson start").Err)
	c := f.lock(t, append([]string{"--key", key, "--wait", "40s"}, j.sh("")...)...)
	require.Eventually(t, func() bool { return f.queued(t, key) }, 30*time.Second, 5*time.Millisecond, "coordinator lock waits: %s", c.stderr)
	doomed.Kill()
	// Written once the holder is dead: the coordinator's start must follow.
	fd, err := os.OpenFile(string(j), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = fd.WriteString("redisson killed\n")
	require.NoError(t, err)
	require.NoError(t, fd.Close())
	require.Equal(t, 0, c.exit(t), "%s", c.stderr)
	j.requireNoOverlap(t, "redisson start", "redisson killed", "coordinator start", "coordinator end")
}

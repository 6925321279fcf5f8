package testenv_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// envKilledHelper makes TestKilledTestBinaryLeavesNoServer its own helper:
// the test binary, run again with it set, starts one server of each kind,
// says where they are and waits to be killed.
const envKilledHelper = "TESTENV_KILLED_BINARY_HELPER"

// A test binary killed with SIGKILL (a CI timeout, an impatient developer)
// runs no cleanup at all. Whatever servers it started must die anyway: the
// redis-server, the postmaster and every backend under it.
func TestKilledTestBinaryLeavesNoServer(t *testing.T) {
	if os.Getenv(envKilledHelper) != "" {
		killedHelper(t)
		return
	}
	t.Parallel()
	exe, err := os.Executable()
	require.NoError(t, err)
	// The helper's own deadline bounds it should this test fail to kill it.
	helper := exec.Command(exe, "-test.run=^TestKilledTestBinaryLeavesNoServer$", "-test.timeout=3m")
	// Its temporary files go where we remove them: a killed process cleans
	// nothing up. Readable by all, for the server's OS user.
	tmp, err := os.MkdirTemp("", "testenv-killed-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	require.NoError(t, os.Chmod(tmp, 0o755))
	helper.Env = append(os.Environ(), envKilledHelper+"=1", "TMPDIR="+tmp)
	helper.Stderr = os.Stderr
	helper.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // and it dies with us
	stdout, err := helper.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, helper.Start())
	t.Cleanup(func() { _ = helper.Process.Kill(); _ = helper.Wait() })

	lines := make(chan string, 1)
	var out strings.Builder // the helper's other lines: its failure, if any
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "servers ") {
				lines <- l
			} else {
				out.WriteString(l + "\n")
			}
		}
		close(lines)
	}()
	var line string
	select {
	case l, ok := <-lines:
		require.True(t, ok, "the helper exited before starting its servers:\n%s", &out)
		line = l
	case <-time.After(2 * time.Minute):
		t.Fatal("the helper did not start its servers within 2m")
	}
	var redisPID, redisPort, pgPID, pgPort int
	_, err = fmt.Sscanf(line, "servers redis=%d:%d postgres=%d:%d", &redisPID, &redisPort, &pgPID, &pgPort)
	require.NoError(t, err, line)

	tree := descendants(t, helper.Process.Pid)
	require.Contains(t, tree, redisPID, "redis-server runs under the helper")
	require.Contains(t, tree, pgPID, "the postmaster runs under the helper")
	backends := 0
	for pid := range tree {
		if ppid, _, _ := procStat(pid); ppid == pgPID {
			backends++
		}
	}
	require.Positive(t, backends, "the postmaster has its processes")
	t.Logf("helper %d has %d processes under it: redis-server %d, postmaster %d with %d children",
		helper.Process.Pid, len(tree), redisPID, pgPID, backends)

	require.NoError(t, helper.Process.Signal(syscall.SIGKILL))
	_ = helper.Wait()

	// The kernel signals the servers at once; they take a moment to exit.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for pid, started := range tree {
			_, start, state := procStat(pid)
			alive := start == started && state != "Z" && state != "X" // a zombie has exited
			require.False(c, alive, "process %d (%s) outlived the killed test binary", pid, cmdline(pid))
		}
	}, 30*time.Second, 50*time.Millisecond)
	for _, port := range []int{redisPort, pgPort} {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			_ = conn.Close()
		}
		require.Error(t, err, "something still listens on port %d", port)
	}
}

// killedHelper is the helper side: start the servers, hold a session open
// on Postgres (so a backend exists too), report, wait to be killed.
func killedHelper(t *testing.T) {
	r := testenv.StartRedisServer(t)
	pg := testenv.StartPostgresServer(t)
	pool, err := postgres.Connect(context.Background(), pg.DSN(), 1)
	require.NoError(t, err)
	defer pool.Close()
	_, redisPort, _ := net.SplitHostPort(r.Addr())
	fmt.Printf("servers redis=%d:%s postgres=%d:%d\n", r.PID(), redisPort, pg.PID(), pg.Port())
	<-make(chan struct{}) // killed here, or by -test.timeout
}

// descendants returns every process below pid, with its start time (to tell
// it from a later process that reuses the pid).
func descendants(t *testing.T, root int) map[int]uint64 {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, _ := procStat(pid); ppid > 0 {
			children[ppid] = append(children[ppid], pid)
		}
	}
	out := map[int]uint64{}
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			_, start, _ := procStat(c)
			out[c] = start
			queue = append(queue, c)
		}
	}
	return out
}

// procStat reads a process's parent, start time (clock ticks since boot)
// and state from /proc; zero values if it does not exist.
func procStat(pid int) (ppid int, start uint64, state string) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, ""
	}
	// The command name may hold spaces and parentheses: fields start after the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, ""
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, 0, ""
	}
	ppid, _ = strconv.Atoi(f[1])
	start, _ = strconv.ParseUint(f[19], 10, 64)
	return ppid, start, f[0]
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

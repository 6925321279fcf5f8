package proctree

import (
	"bufio"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The test binary doubles as the command: PROCTREE_HELPER=root|middle|leaf.
// root starts middle in a new session and exits or waits; middle starts leaf
// and exits at once (a double fork), so leaf's parent dies and leaf is
// re-parented to the subreaper. leaf writes its pid to fd 3 and waits.
const helperEnv = "PROCTREE_HELPER"

func TestMain(m *testing.M) {
	if role := os.Getenv(helperEnv); role != "" {
		os.Exit(helper(role))
	}
	os.Exit(m.Run())
}

func helper(role string) int {
	if os.Getenv("PROCTREE_IGNORE_TERM") != "" {
		signal.Ignore(syscall.SIGTERM)
	}
	self, _ := os.Executable()
	report := os.NewFile(3, "report")
	switch role {
	case "root", "middle":
		next := map[string]string{"root": "middle", "middle": "leaf"}[role]
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), helperEnv+"="+next)
		cmd.ExtraFiles = []*os.File{report}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: role == "root"}
		if err := cmd.Start(); err != nil {
			return 10
		}
		if role == "root" && os.Getenv("PROCTREE_ROOT_WAITS") != "" {
			for {
				time.Sleep(time.Hour)
			}
		}
		return 0 // middle and root exit without waiting: leaf is orphaned
	case "leaf":
		_, _ = report.WriteString(strconv.Itoa(os.Getpid()) + "\n")
		_ = report.Close()
		for {
			time.Sleep(time.Hour)
		}
	}
	return 11
}

type started struct {
	tree *Tree
	leaf int
}

func start(t *testing.T, env ...string) started {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	devnull, err := os.Open(os.DevNull)
	require.NoError(t, err)
	defer devnull.Close()
	tree, err := Start(Config{
		Path: self, Args: []string{self},
		Env:   append(os.Environ(), append(env, helperEnv+"=root")...),
		Files: []*os.File{devnull, os.Stderr, os.Stderr, w},
	})
	_ = w.Close()
	require.NoError(t, err)
	t.Cleanup(func() {
		tree.Kill()
		for range tree.Events() {
		}
	})
	line, err := bufio.NewReader(r).ReadString('\n')
	require.NoError(t, err, "the leaf reports its pid")
	leaf, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err)
	return started{tree: tree, leaf: leaf}
}

// next returns the next event, failing the test after a generous bound.
func next(t *testing.T, tree *Tree) Event {
	t.Helper()
	select {
	case ev := <-tree.Events():
		return ev
	case <-time.After(20 * time.Second):
		t.Fatal("no event from the tree")
	}
	return Event{}
}

func TestEscapedDescendantIsReparentedAndSignalled(t *testing.T) {
	s := start(t)
	ev := next(t, s.tree)
	require.Equal(t, RootExited, ev.Kind)
	require.True(t, ev.Status.Exited())

	// The leaf left the command's session, and its parent is gone (or
	// going: the middle process may still be exiting when the root has
	// exited): it becomes ours, and the tree is not empty while it lives.
	require.Eventually(t, func() bool {
		st, ok := readStat(s.leaf)
		return ok && st.ppid == os.Getpid()
	}, 20*time.Second, time.Millisecond, "the leaf outlived its parents and was re-parented to the subreaper")
	require.Contains(t, liveDescendants(os.Getpid()), s.leaf)
	select {
	case ev := <-s.tree.Events():
		t.Fatalf("%v while the leaf still runs", ev.Kind)
	default:
	}

	// (The middle process may not have finished exiting yet: at least one.)
	require.GreaterOrEqual(t, s.tree.Signal(syscall.SIGTERM), 1, "SIGTERM reached the escaped leaf")
	require.Equal(t, Empty, next(t, s.tree).Kind)
	_, ok := readStat(s.leaf)
	require.False(t, ok, "the leaf is dead and reaped")
}

func TestKillEndsATreeThatIgnoresSIGTERM(t *testing.T) {
	s := start(t, "PROCTREE_IGNORE_TERM=1", "PROCTREE_ROOT_WAITS=1")
	require.GreaterOrEqual(t, s.tree.Signal(syscall.SIGTERM), 2, "root and leaf")
	require.NoError(t, s.tree.SignalGroup(syscall.SIGTERM))
	require.Contains(t, liveDescendants(os.Getpid()), s.leaf, "both ignore it")

	s.tree.Kill()
	ev := next(t, s.tree)
	require.Equal(t, RootExited, ev.Kind)
	require.Equal(t, syscall.SIGKILL, ev.Status.Signal())
	require.Equal(t, Empty, next(t, s.tree).Kind)
	require.Empty(t, liveDescendants(os.Getpid()))
	require.ErrorIs(t, s.tree.SignalGroup(syscall.SIGTERM), ErrRootGone)
}

func TestReadStatParsesCommWithParentheses(t *testing.T) {
	st, ok := readStat(os.Getpid())
	require.True(t, ok)
	require.Equal(t, os.Getppid(), st.ppid)
	require.False(t, isDescendant(os.Getpid(), os.Getppid()))
}

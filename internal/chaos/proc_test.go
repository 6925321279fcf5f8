package chaos

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A child that ignores SIGTERM past its grace gets SIGQUIT before SIGKILL
// (a Go program then dumps its goroutines into its log), and the tail
// returned is its output from before the dump. One that exits on SIGTERM
// gets nothing more.
func TestStopDumpingSendsSIGQUITToAHungChild(t *testing.T) {
	hung := exec.Command("sh", "-c", `trap "" TERM; trap "echo dumped; exit 3" QUIT; echo ready; while :; do sleep 0.05; done`)
	p, err := startProc("hung", hung, procOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(p.tailLines(1)) == 1 }, 10*time.Second, 10*time.Millisecond)
	inTime, tail := p.stopDumping(syscall.SIGTERM, 300*time.Millisecond, 10*time.Second)
	require.False(t, inTime, "it ignored SIGTERM")
	require.Equal(t, []string{"ready"}, tail, "the tail from before the dump")
	require.Equal(t, 3, p.exitCode(), "it ended on SIGQUIT, not SIGKILL")
	require.Contains(t, p.tailLines(2), "dumped")

	quick := exec.Command("sh", "-c", `trap "exit 0" TERM; trap "echo dumped; exit 3" QUIT; echo ready; while :; do sleep 0.05; done`)
	p, err = startProc("quick", quick, procOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(p.tailLines(1)) == 1 }, 10*time.Second, 10*time.Millisecond)
	inTime, tail = p.stopDumping(syscall.SIGTERM, 10*time.Second, 10*time.Second)
	require.True(t, inTime)
	require.Nil(t, tail)
	require.NotContains(t, p.tailLines(2), "dumped")
}

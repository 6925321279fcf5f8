package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/job"
)

// terminalJob runs `coordinator lock ARGS` as the foreground job of a shell
// (helperJobShell) on a fresh pseudo-terminal.
type terminalJob struct {
	t        *testing.T
	master   *os.File
	out      *ptyOutput
	reports  *bufio.Scanner
	commands *os.File
}

func startTerminalJob(t *testing.T, vars map[string]string, args ...string) *terminalJob {
	t.Helper()
	master, slavePath := openPTY(t)
	slave, err := os.OpenFile(slavePath, os.O_RDWR, 0)
	require.NoError(t, err)
	defer slave.Close()
	reportR, reportW, err := os.Pipe()
	require.NoError(t, err)
	cmdR, cmdW, err := os.Pipe()
	require.NoError(t, err)
	t.Cleanup(func() { _ = reportR.Close(); _ = cmdW.Close() })

	shell := exec.Command(testBinary(t), append([]string{"jobshell", coordinatorBinary(t), "lock"}, args...)...)
	shell.Env = lockEnv(vars)
	shell.Stdin, shell.Stdout, shell.Stderr = slave, slave, slave
	shell.ExtraFiles = []*os.File{reportW, cmdR}
	// A session of its own with the pty as controlling terminal; it dies
	// with the test binary.
	shell.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0, Pdeathsig: syscall.SIGKILL}
	require.NoError(t, shell.Start())
	_ = reportW.Close()
	_ = cmdR.Close()
	done := make(chan struct{})
	go func() { _ = shell.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			_ = shell.Process.Kill()
			<-done
		}
	})
	return &terminalJob{t: t, master: master, out: readPTY(master), reports: bufio.NewScanner(reportR), commands: cmdW}
}

// type_ writes keystrokes to the terminal.
func (j *terminalJob) type_(s string) {
	j.t.Helper()
	_, err := j.master.WriteString(s)
	require.NoError(j.t, err)
}

// report waits for the shell's next report line ("stopped SIG", "exit N").
func (j *terminalJob) report() string {
	j.t.Helper()
	line := make(chan string, 1)
	go func() {
		if j.reports.Scan() {
			line <- j.reports.Text()
		}
		close(line)
	}()
	select {
	case l, ok := <-line:
		require.True(j.t, ok, "the shell ended without a report; terminal:\n%s", j.out)
		return l
	case <-time.After(30 * time.Second):
		j.t.Fatalf("no report from the shell; terminal:\n%s", j.out)
	}
	return ""
}

func (j *terminalJob) command(c string) {
	j.t.Helper()
	_, err := fmt.Fprintln(j.commands, c)
	require.NoError(j.t, err)
}

var ttyHello = regexp.MustCompile(`pid=(\d+) pgrp=(\d+) fg=(\w+)`)

// commandPid waits for the tty helper's greeting and checks that it is the
// terminal's foreground process group.
func (j *terminalJob) commandPid() int {
	j.t.Helper()
	j.out.waitFor(j.t, "fg=")
	m := ttyHello.FindStringSubmatch(j.out.String())
	require.NotNil(j.t, m, j.out.String())
	require.Equal(j.t, m[1], m[2], "the command leads its own process group")
	require.Equal(j.t, "true", m[3], "the command is the terminal's foreground group")
	pid, _ := strconv.Atoi(m[1])
	return pid
}

// On a terminal the command is the foreground job: it reads the terminal,
// Ctrl-Z stops it and then the coordinator (so the shell gets the terminal
// back), and `fg` continues both, with the command in the foreground again.
func TestLockTerminalForegroundAndJobControl(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	ready := filepath.Join(t.TempDir(), "ready")
	noOrphans(t, ready)
	j := startTerminalJob(t, e.with("COORDINATOR_LOCK_WATCHDOG_TIMEOUT", "30s"),
		append([]string{"--key", "cli/tty", "--"}, helperArgv(t, "tree", "-tty", "-ready", ready)...)...)
	pid := j.commandPid()

	j.type_("hello\n")
	j.out.waitFor(t, "read hello fg=true")

	j.type_("\x1a") // Ctrl-Z
	require.Equal(t, "stopped SIGSTOP", j.report(), "the coordinator stops after its command; terminal:\n%s", j.out)
	require.Equal(t, "T", procState(pid), "the command is stopped")
	require.True(t, e.exists(t, "cli/tty"), "the lock is kept while stopped")

	j.command("fg")
	j.type_("again\n")
	j.out.waitFor(t, "read again fg=true")
	j.type_("exit\n")
	require.Equal(t, "exit 0", j.report(), j.out.String())
	require.False(t, e.exists(t, "cli/tty"), "released")
}

// Stopped for longer than the lease: on `fg` the command is not continued
// (it could run after another holder took the lock), it is killed.
func TestLockStoppedPastItsLeaseIsKilledNotContinued(t *testing.T) {
	t.Parallel()
	e := newLockCLIEnv(t)
	ready := filepath.Join(t.TempDir(), "ready")
	noOrphans(t, ready)
	j := startTerminalJob(t, e.vars,
		append([]string{"--key", "cli/ttylease", "--lease", "3s", "--grace", "500ms", "--"}, helperArgv(t, "tree", "-tty", "-ready", ready)...)...)
	pid := j.commandPid()

	j.type_("\x1a")
	require.Equal(t, "stopped SIGSTOP", j.report(), j.out.String())
	// Waiting for the lease to run out is the behaviour under test.
	require.Eventually(t, func() bool { return !e.exists(t, "cli/ttylease") }, 30*time.Second, 20*time.Millisecond)
	j.command("fg")
	j.type_("late\n")
	require.Equal(t, fmt.Sprintf("exit %d", job.ExitLost), j.report(), j.out.String())
	require.NotContains(t, j.out.String(), "read late", "the command ran again after its lease")
	require.False(t, alive(t, pid))
	require.False(t, strings.Contains(j.out.String(), "stdin ended"))
}

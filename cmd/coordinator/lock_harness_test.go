package main

// The harness of the `coordinator lock` process tests: the real binary, a
// helper command (this test binary, re-executed), a TCP proxy that can cut
// the coordinator off from Redis, and a pseudo-terminal.

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// helperEnv makes the test binary act as a helper program (TestMain); its
// first argument names the helper.
const helperEnv = "LOCKTEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelper(os.Args[1:]))
	}
	// Run under nohup (SIGHUP ignored), every coordinator the tests start
	// would inherit the ignoring and rightly leave SIGHUP alone, and the
	// SIGHUP cases would test nohup instead. Catching it here gives the
	// children the default disposition again (exec resets caught signals).
	if signal.Ignored(syscall.SIGHUP) {
		signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP)
	}
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

// coordinatorBinary builds the coordinator once per test run.
func coordinatorBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "coordinator-lock-test-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "coordinator")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v: %s", err, out)
		}
	})
	require.NoError(t, binErr)
	return binPath
}

func testBinary(t *testing.T) string {
	t.Helper()
	p, err := os.Executable()
	require.NoError(t, err)
	return p
}

// helperArgv is the command line of a helper run as the locked command.
func helperArgv(t *testing.T, name string, args ...string) []string {
	return append([]string{testBinary(t), name}, args...)
}

// lockProc is one `coordinator lock` process.
type lockProc struct {
	t              *testing.T
	cmd            *exec.Cmd
	stdout, stderr string // file names
	done           chan struct{}
	code           int
}

// lockEnv is the coordinator's environment: vars, plus what the helper needs.
func lockEnv(vars map[string]string) []string {
	env := []string{"PATH=" + os.Getenv("PATH"), helperEnv + "=1"}
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	return env
}

// startLock starts the coordinator binary with args. Its output goes to
// files, not pipes: a process that wrongly outlives it cannot block the test.
// It dies with the test binary (Pdeathsig).
func startLock(t *testing.T, vars map[string]string, args ...string) *lockProc {
	t.Helper()
	dir := t.TempDir()
	p := &lockProc{t: t, stdout: filepath.Join(dir, "stdout"), stderr: filepath.Join(dir, "stderr"), done: make(chan struct{})}
	out, err := os.Create(p.stdout)
	require.NoError(t, err)
	errf, err := os.Create(p.stderr)
	require.NoError(t, err)
	p.cmd = exec.Command(coordinatorBinary(t), append([]string{"lock"}, args...)...)
	p.cmd.Env = lockEnv(vars)
	p.cmd.Stdout, p.cmd.Stderr = out, errf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, p.cmd.Start())
	_ = out.Close()
	_ = errf.Close()
	go func() {
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.code = 128 + int(ws.Signal())
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

func (p *lockProc) signal(sig syscall.Signal) {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(sig))
}

// wait waits for the coordinator to exit; bound is a failure bound only.
func (p *lockProc) wait(bound time.Duration) (code int, stdout, stderr string) {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(bound):
		p.t.Fatalf("coordinator lock still running after %s; stderr:\n%s", bound, p.readErr())
	}
	out, _ := os.ReadFile(p.stdout)
	return p.code, string(out), p.readErr()
}

func (p *lockProc) readErr() string {
	b, _ := os.ReadFile(p.stderr)
	return string(b)
}

// treePids reads the pids a tree helper wrote to its ready file ("role pid"
// lines) once it is set up; it fails after a generous bound.
func treePids(t *testing.T, ready string) map[string]int {
	t.Helper()
	return readTreePids(t, ready, nil)
}

// treePids is treePids for the tree p runs: it fails at once, with p's
// stderr, when p exits before its command is ready (the lock not taken).
func (p *lockProc) treePids(t *testing.T, ready string) map[string]int {
	t.Helper()
	return readTreePids(t, ready, p)
}

func readTreePids(t *testing.T, ready string, p *lockProc) map[string]int {
	t.Helper()
	var b []byte
	require.Eventually(t, func() bool {
		var err error
		if b, err = os.ReadFile(ready); err == nil {
			return true
		}
		if p != nil {
			select {
			case <-p.done:
				b, _ = os.ReadFile(ready)
				require.NotEmpty(t, b, "coordinator lock exited %d before its command was ready:\n%s", p.code, p.readErr())
				return true
			default:
			}
		}
		return false
	}, 30*time.Second, 10*time.Millisecond, "the command never became ready")
	pids := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		role, pid, _ := strings.Cut(line, " ")
		n, err := strconv.Atoi(pid)
		require.NoError(t, err, line)
		pids[role] = n
	}
	return pids
}

// alive reports whether pid is a live (not zombie) process running the test
// binary, i.e. one of our helpers.
func alive(t *testing.T, pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	if i := strings.LastIndexByte(string(b), ')'); i > 0 {
		if f := strings.Fields(string(b[i+1:])); len(f) > 0 && (f[0] == "Z" || f[0] == "X") {
			return false
		}
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	return err == nil && exe == testBinary(t)
}

// procState is the state letter of pid (R, S, T, ...), "" when gone.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// noOrphans makes the test fail if a helper process of ready's tree is still
// alive when the test ends, and kills it.
func noOrphans(t *testing.T, ready string) {
	t.Cleanup(func() {
		b, err := os.ReadFile(ready)
		if err != nil {
			return
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			role, s, _ := strings.Cut(line, " ")
			pid, _ := strconv.Atoi(s)
			if pid > 0 && alive(t, pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				t.Errorf("the command's %s (pid %d) outlived the test", role, pid)
			}
		}
	})
}

// cutProxy forwards TCP connections to a Redis server until Cut: then it
// keeps every connection open but forwards nothing, like a partition.
type cutProxy struct {
	ln     net.Listener
	target string
	cut    atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func newCutProxy(t *testing.T, redisURL string) (*cutProxy, string) {
	t.Helper()
	u, err := url.Parse(redisURL)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cutProxy{ln: ln, target: u.Host}
	go p.serve()
	t.Cleanup(p.close)
	u.Host = ln.Addr().String()
	return p, u.String()
}

func (p *cutProxy) Cut() { p.cut.Store(true) }

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go p.pump(c, s)
		go p.pump(s, c)
	}
}

func (p *cutProxy) pump(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 && !p.cut.Load() {
			if _, werr := to.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *cutProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

// openPTY returns a pseudo-terminal's master and the path of its slave.
func openPTY(t *testing.T) (*os.File, string) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	require.NoError(t, unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0))
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	require.NoError(t, err)
	return m, fmt.Sprintf("/dev/pts/%d", n)
}

// ---- helpers run as commands ----

func runHelper(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "helper: no name")
		return 100
	}
	switch args[0] {
	case "tree":
		return helperTree(args[1:])
	case "checkfree":
		return helperCheckFree(args[1:])
	case "jobshell":
		return helperJobShell(args[1:])
	}
	fmt.Fprintf(os.Stderr, "helper: unknown %q\n", args[0])
	return 100
}

// helperTree is the locked command of most tests. Flags:
//
//	-flock F       hold an exclusive flock on F, shared by every process of the
//	               tree (the descriptor is inherited): while any of them lives,
//	               F is locked
//	-ready F       write "role pid" lines for every process once all are set up
//	-escape        start a leaf in a new session through a middle process that
//	               exits at once (setsid + double fork): the leaf outlives its
//	               parent and leaves the command's group and session
//	-exit          the root exits 0 as soon as the tree is ready
//	-ignore-term   every process ignores SIGTERM and SIGINT (still recorded)
//	-record-only   the root only records INT, TERM, HUP (it exits 0 on SIGUSR1)
//	-signals F     append "role SIGNAL" to F for each INT, TERM, HUP, QUIT, CONT
//	-term-exit N   exit N on SIGTERM (root); default 143
//	-tty           print "pid=P pgrp=G fg=true|false", then echo each line read
//	               from stdin as "read LINE fg=..." until "exit"
//	-env           print the environment and exit
//	-role R        internal: root, middle or leaf
func helperTree(args []string) int {
	fs := flag.NewFlagSet("tree", flag.ContinueOnError)
	flockPath := fs.String("flock", "", "")
	ready := fs.String("ready", "", "")
	escape := fs.Bool("escape", false, "")
	exitNow := fs.Bool("exit", false, "")
	ignoreTerm := fs.Bool("ignore-term", false, "")
	recordOnly := fs.Bool("record-only", false, "")
	sigPath := fs.String("signals", "", "")
	termExit := fs.Int("term-exit", 143, "")
	tty := fs.Bool("tty", false, "")
	printEnv := fs.Bool("env", false, "")
	role := fs.String("role", "root", "")
	if err := fs.Parse(args); err != nil {
		return 100
	}
	if *printEnv {
		for _, kv := range os.Environ() {
			fmt.Println(kv)
		}
		return 0
	}

	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGCONT, syscall.SIGUSR1)
	record := func(s os.Signal) {
		if *sigPath == "" {
			return
		}
		f, err := os.OpenFile(*sigPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			_, _ = fmt.Fprintf(f, "%s %s\n", *role, unix.SignalName(s.(syscall.Signal)))
			_ = f.Close()
		}
	}

	// fd 3: the flock file (inherited below the root); fd 4: where the leaf
	// reports its pid to the root.
	var lockFile *os.File
	switch {
	case *role != "root":
		lockFile = os.NewFile(3, "flock")
	case *flockPath != "":
		f, err := os.OpenFile(*flockPath, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return 101
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			fmt.Fprintln(os.Stderr, "helper: flock already held: a previous holder's tree is alive")
			return 102
		}
		lockFile = f
	}
	if lockFile == nil {
		lockFile, _ = os.Open(os.DevNull)
	}

	lines := []string{fmt.Sprintf("%s %d", *role, os.Getpid())}
	switch *role {
	case "root", "middle":
		if !*escape {
			break
		}
		next := map[string]string{"root": "middle", "middle": "leaf"}[*role]
		var report *os.File
		var fromLeaf *os.File
		if *role == "root" {
			r, w, err := os.Pipe()
			if err != nil {
				return 103
			}
			fromLeaf, report = r, w
		} else {
			report = os.NewFile(4, "report")
		}
		self, _ := os.Executable()
		child := exec.Command(self, "tree", "-role", next, "-escape", "-signals", *sigPath, "-term-exit", strconv.Itoa(*termExit))
		if *ignoreTerm {
			child.Args = append(child.Args, "-ignore-term")
		}
		child.Env = os.Environ()
		child.Stdout, child.Stderr = os.Stdout, os.Stderr // the leaf keeps the command's output open
		child.ExtraFiles = []*os.File{lockFile, report}
		child.SysProcAttr = &syscall.SysProcAttr{Setsid: *role == "root"}
		if err := child.Start(); err != nil {
			return 104
		}
		if *role == "middle" {
			return 0 // without waiting: the leaf is orphaned
		}
		_ = report.Close()
		leafLine, err := bufio.NewReader(fromLeaf).ReadString('\n')
		if err != nil {
			return 105
		}
		lines = append(lines, strings.TrimSpace(leafLine))
		// The middle is reaped by nobody but the subreaper (or init).
	case "leaf":
		report := os.NewFile(4, "report")
		_, _ = fmt.Fprintf(report, "leaf %d\n", os.Getpid())
		_ = report.Close()
	}

	if *role == "root" && *ready != "" {
		tmp := *ready + ".tmp"
		if err := os.WriteFile(tmp, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			return 106
		}
		if err := os.Rename(tmp, *ready); err != nil {
			return 107
		}
	}
	if *role == "root" && *exitNow {
		return 0
	}
	if *role == "root" && *tty {
		go func() {
			for s := range sigs {
				record(s)
			}
		}()
		return ttyLoop()
	}
	for s := range sigs {
		if s == syscall.SIGUSR1 {
			return 0
		}
		record(s)
		switch {
		case *recordOnly:
		case s == syscall.SIGTERM && !*ignoreTerm:
			return *termExit
		case s == syscall.SIGINT && !*ignoreTerm:
			return 130
		case s == syscall.SIGHUP && !*ignoreTerm:
			return 129
		}
	}
	return 0
}

func isForeground() bool {
	fg, err := unix.IoctlGetInt(0, unix.TIOCGPGRP)
	return err == nil && fg == unix.Getpgrp()
}

func ttyLoop() int {
	fmt.Printf("pid=%d pgrp=%d fg=%t\n", os.Getpid(), unix.Getpgrp(), isForeground())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		fmt.Printf("read %s fg=%t\n", line, isForeground())
		if line == "exit" {
			return 0
		}
	}
	fmt.Printf("stdin ended: %v\n", in.Err())
	return 3
}

// helperCheckFree prints "free" when the flock file is not held, "held"
// (exit 3) when a process of an earlier tree still holds it.
func helperCheckFree(args []string) int {
	f, err := os.OpenFile(args[0], os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return 101
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		fmt.Println("held")
		return 3
	}
	fmt.Println("free")
	return 0
}

// helperJobShell plays an interactive shell on its controlling terminal
// (stdin): it runs argv as a foreground job in its own process group and
// reports on fd 3 ("stopped SIG", "exit CODE"); on fd 4 it takes "fg" (give
// the job the terminal and continue it) and "bg" (continue it in the
// background).
func helperJobShell(argv []string) int {
	report := os.NewFile(3, "report")
	commands := bufio.NewScanner(os.NewFile(4, "commands"))
	job := exec.Command(argv[0], argv[1:]...)
	job.Stdin, job.Stdout, job.Stderr = os.Stdin, os.Stdout, os.Stderr
	job.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Foreground: true, Ctty: 0}
	if err := job.Start(); err != nil {
		fmt.Fprintf(report, "start %v\n", err)
		return 1
	}
	// Like a shell: stop signals and background writes do not concern us.
	signal.Ignore(syscall.SIGTTOU, syscall.SIGTTIN, syscall.SIGTSTP)
	pid := job.Process.Pid
	for {
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, unix.WUNTRACED, nil); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			fmt.Fprintf(report, "wait %v\n", err)
			return 1
		}
		switch {
		case ws.Exited():
			fmt.Fprintf(report, "exit %d\n", ws.ExitStatus())
			return 0
		case ws.Signaled():
			fmt.Fprintf(report, "exit %d\n", 128+int(ws.Signal()))
			return 0
		case ws.Stopped():
			_ = unix.IoctlSetPointerInt(0, unix.TIOCSPGRP, unix.Getpgrp())
			fmt.Fprintf(report, "stopped %s\n", unix.SignalName(ws.StopSignal()))
			if !commands.Scan() {
				return 1
			}
			if commands.Text() == "fg" {
				_ = unix.IoctlSetPointerInt(0, unix.TIOCSPGRP, pid)
			}
			_ = syscall.Kill(-pid, syscall.SIGCONT)
		}
	}
}

// ptyOutput collects what is written to a pseudo-terminal.
type ptyOutput struct {
	mu  sync.Mutex
	buf strings.Builder
}

func readPTY(m *os.File) *ptyOutput {
	o := &ptyOutput{}
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := m.Read(b)
			o.mu.Lock()
			o.buf.Write(b[:n])
			o.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return o
}

func (o *ptyOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// waitFor waits until the terminal shows s.
func (o *ptyOutput) waitFor(t *testing.T, s string) {
	t.Helper()
	require.Eventually(t, func() bool { return strings.Contains(o.String(), s) }, 20*time.Second, 10*time.Millisecond,
		"the terminal never showed %q; it shows:\n%s", s, o)
}

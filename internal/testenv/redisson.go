package testenv

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Variables naming the Redisson side of the mixed-fleet tests
// (scripts/redisson, built by `scripts/services install redisson`).
const (
	// EnvRedissonHome holds one directory per version, <version>/lib/*.jar.
	EnvRedissonHome = "COORDINATOR_TEST_REDISSON_HOME"
	// EnvRedissonVersions lists the versions built there (space-separated).
	EnvRedissonVersions = "COORDINATOR_TEST_REDISSON_VERSIONS"
)

// RedissonVersions returns the Redisson versions the mixed-fleet tests run
// against. It fails the test when they are not built: they are never
// skipped silently.
func RedissonVersions(t testing.TB) []string {
	t.Helper()
	home, versions := os.Getenv(EnvRedissonHome), strings.Fields(strings.ReplaceAll(os.Getenv(EnvRedissonVersions), ",", " "))
	if home == "" || len(versions) == 0 {
		t.Fatalf("testenv: no Redisson harness: set %s and %s (run `scripts/services install redisson` and `eval \"$(scripts/services env)\"`, or `make test`)", EnvRedissonHome, EnvRedissonVersions)
	}
	for _, v := range versions {
		if _, err := os.Stat(filepath.Join(home, v, ".complete")); err != nil {
			t.Fatalf("testenv: the Redisson %s harness is not built in %s: run `scripts/services install redisson`", v, home)
		}
	}
	return versions
}

// RedissonTarget says which Redis a Redisson process connects to: a single
// server (URL redis://host:port) or a cluster (its nodes' host:port).
type RedissonTarget struct {
	URL     string
	Cluster []string
}

// Redisson is a Java process with one Redisson client (scripts/redisson),
// driven over its stdin/stdout line protocol. Its commands run on workers:
// each worker is a Java thread of its own (an RLock's owner is its thread).
type Redisson struct {
	t        testing.TB
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	ClientID string
	Version  string

	mu      sync.Mutex
	pending map[string][]chan RedissonReply // by worker, in order
	done    chan struct{}                   // stdout ended
	stderr  *Buffer                         // the harness's stderr, for error messages
}

// RedissonReply is one answer: the words after "ok", or Err.
type RedissonReply struct {
	Words []string
	Err   error
}

// Micros reads word i of the reply as a wall-clock time in microseconds
// since the epoch.
func (r RedissonReply) Micros(i int) time.Time {
	if i >= len(r.Words) {
		return time.Time{}
	}
	n, err := strconv.ParseInt(r.Words[i], 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMicro(n)
}

// StartRedisson starts the harness of Redisson version on target, with
// Redisson's lock watchdog timeout watchdog, and waits until its client is
// connected. It is killed when the test ends.
func StartRedisson(t testing.TB, version string, target RedissonTarget, watchdog time.Duration) *Redisson {
	t.Helper()
	home := os.Getenv(EnvRedissonHome)
	args := []string{
		// Start-up over peak speed: each test's JVM lives for seconds.
		"-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xss512k", "-Xmx128m",
		"-cp", filepath.Join(home, version, "lib", "*"), "interop.Main",
		"--watchdog-ms", strconv.FormatInt(watchdog.Milliseconds(), 10),
	}
	if len(target.Cluster) > 0 {
		args = append(args, "--cluster", strings.Join(target.Cluster, ","))
	} else {
		args = append(args, "--redis", target.URL)
	}
	cmd := exec.Command("java", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	r := &Redisson{t: t, cmd: cmd, stdin: stdin, pending: map[string][]chan RedissonReply{}, done: make(chan struct{}),
		stderr: &Buffer{}}
	errR, errW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = errW
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start the Redisson %s harness (java): %v", version, err)
	}
	_ = errW.Close()
	go func() {
		defer errR.Close()
		_, _ = io.Copy(r.stderr, errR)
	}()
	ready := make(chan string, 1)
	go r.read(stdout, ready)
	t.Cleanup(func() { r.Kill() })
	select {
	case line := <-ready:
		f := strings.Fields(line)
		if len(f) < 3 {
			t.Fatalf("testenv: Redisson harness said %q", line)
		}
		r.ClientID, r.Version = f[1], f[2]
	case <-r.done:
		_ = cmd.Wait()
		t.Fatalf("testenv: the Redisson %s harness exited at start: %s", version, r.stderr)
	case <-time.After(60 * time.Second):
		t.Fatalf("testenv: the Redisson %s harness was not ready within 60s: %s", version, r.stderr)
	}
	if r.Version != version {
		t.Fatalf("testenv: the harness built for Redisson %s runs %s", version, r.Version)
	}
	return r
}

func (r *Redisson) read(stdout io.Reader, ready chan<- string) {
	defer close(r.done)
	sc := bufio.NewScanner(stdout)
	first := true
	for sc.Scan() {
		line := sc.Text()
		if first {
			first = false
			ready <- line
			continue
		}
		worker, rest, _ := strings.Cut(line, " ")
		status, words, _ := strings.Cut(rest, " ")
		reply := RedissonReply{Words: strings.Fields(words)}
		if status != "ok" {
			reply = RedissonReply{Err: fmt.Errorf("redisson %s: %s", worker, words)}
		}
		r.mu.Lock()
		q := r.pending[worker]
		var ch chan RedissonReply
		if len(q) > 0 {
			ch, r.pending[worker] = q[0], q[1:]
		}
		r.mu.Unlock()
		if ch != nil {
			ch <- reply
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for w, q := range r.pending {
		for _, ch := range q {
			ch <- RedissonReply{Err: fmt.Errorf("redisson %s: the harness exited: %s", w, r.stderr)}
		}
		delete(r.pending, w)
	}
}

// Go sends a command to worker and returns the channel its reply comes on.
func (r *Redisson) Go(worker string, words ...string) <-chan RedissonReply {
	ch := make(chan RedissonReply, 1)
	r.mu.Lock()
	select {
	case <-r.done:
		r.mu.Unlock()
		ch <- RedissonReply{Err: fmt.Errorf("redisson %s: the harness has exited", worker)}
		return ch
	default:
	}
	r.pending[worker] = append(r.pending[worker], ch)
	_, err := fmt.Fprintf(r.stdin, "%s %s\n", worker, strings.Join(words, " "))
	r.mu.Unlock()
	if err != nil {
		r.t.Errorf("testenv: write to the Redisson harness: %v", err)
	}
	return ch
}

// Do sends a command to worker and waits (at most a minute) for its reply.
func (r *Redisson) Do(worker string, words ...string) RedissonReply {
	r.t.Helper()
	select {
	case rep := <-r.Go(worker, words...):
		return rep
	case <-time.After(time.Minute):
		r.t.Fatalf("testenv: Redisson %s %v: no reply within a minute", worker, words)
		return RedissonReply{}
	}
}

// Kill ends the process with SIGKILL (by its PID) and waits for it: its
// locks stay in Redis until their TTL.
func (r *Redisson) Kill() {
	if r.cmd.Process == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.done
	_ = r.cmd.Wait()
}

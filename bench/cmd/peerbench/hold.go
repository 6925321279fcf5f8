package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Workload (d) runs in a child process per library, so that CPU, RSS and
// thread counts are the library's alone. The protocol on the child's stdio,
// the same for the Go and the Java child:
//
//	child -> "ready <acquire_seconds>"   all n locks are held
//	parent measures the window (CPU from /proc/<pid>/stat, Redis commands
//	from INFO stats, RSS and threads from /proc/<pid>/status)
//	parent -> "report"
//	child -> {"goroutines":G,"lost":L}   then releases everything and exits

// holdSettle is the pause between "ready" and the measured window.
const holdSettle = 5 * time.Second

// holdChildReport is the child's last line.
type holdChildReport struct {
	Goroutines int `json:"goroutines"`
	Lost       int `json:"lost"`
	Released   int `json:"released"`
}

// runHoldChild is the child side for a Go library.
func runHoldChild(spec libSpec, cfg libConfig, n int) error {
	l, err := spec.build(cfg)
	if err != nil {
		return err
	}
	defer l.close()
	ctx := context.Background()
	start := time.Now()
	hs := make([]held, 0, n)
	for i := range n {
		var h held
		for attempt := 1; ; attempt++ {
			h, err = l.hold(ctx, fmt.Sprintf("d-hold-%d", i))
			if err == nil {
				break
			}
			// A timeout on a loaded machine: try again, as the Java child
			// does, up to 3 times.
			if attempt == 3 {
				return fmt.Errorf("hold %d: %w", i, err)
			}
		}
		hs = append(hs, h)
	}
	fmt.Printf("ready %.3f\n", time.Since(start).Seconds())
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || strings.TrimSpace(in.Text()) != "report" {
		return errors.New("peerbench: hold child: expected report")
	}
	rep := holdChildReport{Goroutines: runtime.NumGoroutine()}
	for _, h := range hs {
		if c := h.lost(); c != nil {
			select {
			case <-c:
				rep.Lost++
			default:
			}
		}
	}
	for _, h := range hs {
		if h.release(ctx) == nil {
			rep.Released++
		}
	}
	b, _ := json.Marshal(rep)
	fmt.Println(string(b))
	return nil
}

// procStat reads a process's CPU time (utime+stime) from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// f[0] is field 3 (state); utime is field 14, stime 15.
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	const clkTck = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / clkTck, nil
}

// procStatus returns VmRSS (bytes) and Threads from /proc/<pid>/status.
func procStatus(pid int) (rss int64, threads int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		switch k {
		case "VmRSS":
			kb, _ := strconv.ParseInt(f[0], 10, 64)
			rss = kb * 1024
		case "Threads":
			threads, _ = strconv.Atoi(f[0])
		}
	}
	return rss, threads, nil
}

// redisScriptCalls returns EVAL + EVALSHA calls from INFO commandstats
// (every library here renews with a script; pipelined calls each count).
func redisScriptCalls(ctx context.Context, c *redis.Client) (int64, error) {
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		for _, p := range []string{"cmdstat_eval:calls=", "cmdstat_evalsha:calls="} {
			if v, ok := strings.CutPrefix(line, p); ok {
				v, _, _ = strings.Cut(v, ",")
				k, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, err
				}
				n += k
			}
		}
	}
	return n, nil
}

// redisTotalCommands returns total_commands_processed, which counts the
// commands a script runs as well as the script call itself.
func redisTotalCommands(ctx context.Context, c *redis.Client) (int64, error) {
	info, err := c.Info(ctx, "stats").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("peerbench: no total_commands_processed in INFO stats")
}

// measureHold starts cmd (a hold child), waits for it to hold n locks,
// measures a window of d and returns the row.
func measureHold(name string, cmd *exec.Cmd, admin *redis.Client, n int, d time.Duration) (r Result) {
	r = Result{Library: name, Workload: wHold, Locks: n}
	fail := func(err error) Result { r.Error = errString(err); return r }
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fail(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fail(err)
	}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	defer func() {
		_ = stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil && r.Error == "" {
				r.Error = errString(fmt.Errorf("%w: %s", err, stderr.String()))
			}
		case <-time.After(2 * time.Minute):
			_ = cmd.Process.Kill()
			<-done
			r.Error = "peerbench: hold child did not exit"
		}
	}()
	lines := bufio.NewScanner(stdout)
	lines.Buffer(make([]byte, 64<<10), 1<<20)
	readLine := func(timeout time.Duration) (string, error) {
		ch := make(chan bool, 1)
		go func() { ch <- lines.Scan() }()
		select {
		case ok := <-ch:
			if !ok {
				return "", fmt.Errorf("peerbench: hold child closed stdout: %v %s", lines.Err(), stderr.String())
			}
			return lines.Text(), nil
		case <-time.After(timeout):
			_ = cmd.Process.Kill()
			<-ch
			return "", fmt.Errorf("peerbench: hold child timed out: %s", stderr.String())
		}
	}
	line, err := readLine(5 * time.Minute)
	if err != nil {
		return fail(err)
	}
	acq, ok := strings.CutPrefix(line, "ready ")
	if !ok {
		return fail(fmt.Errorf("peerbench: hold child said %q", line))
	}
	r.AcquireSecs, _ = strconv.ParseFloat(acq, 64)

	ctx := context.Background()
	pid := cmd.Process.Pid
	// Let the acquisition burst settle (JIT, GC, pools) before the window.
	time.Sleep(holdSettle)
	cpu0, err1 := procCPU(pid)
	cmds0, err2 := redisTotalCommands(ctx, admin)
	scripts0, err3 := redisScriptCalls(ctx, admin)
	t0 := time.Now()
	if err := errors.Join(err1, err2, err3); err != nil {
		return fail(err)
	}
	time.Sleep(d) // the measured window
	cpu1, err1 := procCPU(pid)
	cmds1, err2 := redisTotalCommands(ctx, admin)
	scripts1, err4 := redisScriptCalls(ctx, admin)
	elapsed := time.Since(t0)
	rss, threads, err3 := procStatus(pid)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return fail(err)
	}
	r.Seconds = elapsed.Seconds()
	r.CPUSeconds = (cpu1 - cpu0).Seconds()
	r.RedisCmdsPS = float64(cmds1-cmds0-2) / elapsed.Seconds() // less our own INFOs
	r.RedisScriptsPS = float64(scripts1-scripts0) / elapsed.Seconds()
	r.RSSBytes = rss
	r.Threads = threads

	if _, err := io.WriteString(stdin, "report\n"); err != nil {
		return fail(err)
	}
	line, err = readLine(2 * time.Minute)
	if err != nil {
		return fail(err)
	}
	var rep holdChildReport
	if err := json.Unmarshal([]byte(line), &rep); err != nil {
		return fail(fmt.Errorf("peerbench: hold child report %q: %w", line, err))
	}
	r.Goroutines = rep.Goroutines
	r.LostDuring = rep.Lost
	if rep.Released != n {
		r.Note = fmt.Sprintf("released %d of %d at the end", rep.Released, n)
	}
	return r
}

// lockedBuffer collects a child's stderr; String may be called while the
// child still writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 64<<10 {
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

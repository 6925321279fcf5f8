package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A runner runs one library's workloads on demand, so that the harness can
// interleave the libraries round by round (the machine's load changes over a
// run; interleaving spreads it over every library alike).
type runner interface {
	name() string
	// has reports whether the library takes part in step ("a", "b", "c4",
	// "c32", "e").
	has(step string) bool
	run(step string) ([]Result, error)
	close() error
}

// goRunner runs a Go library in this process.
type goRunner struct {
	spec         libSpec
	l            lib
	cfg          libConfig
	p            params
	admin        *redis.Client
	lostWatchdog time.Duration
}

func newGoRunner(spec libSpec, cfg libConfig, p params, admin *redis.Client, lostWatchdog time.Duration) (*goRunner, error) {
	l, err := spec.build(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", spec.name, err)
	}
	return &goRunner{spec: spec, l: l, cfg: cfg, p: p, admin: admin, lostWatchdog: lostWatchdog}, nil
}

func (g *goRunner) name() string { return g.spec.name }

func (g *goRunner) has(step string) bool { return strings.IndexByte(g.spec.workloads, step[0]) >= 0 }

func (g *goRunner) run(step string) ([]Result, error) {
	var r Result
	switch step {
	case "a":
		r = runUncontended(g.l, g.spec.name, g.p)
	case "b":
		r = runDistinct(g.l, g.spec.name, 16, g.p)
	case "c4":
		r = runContended(g.l, g.spec.name, 4, g.p)
	case "c32":
		r = runContended(g.l, g.spec.name, 32, g.p)
	case "e":
		cfg := g.cfg
		cfg.watchdog = g.lostWatchdog
		ll, err := g.spec.build(cfg)
		if err != nil {
			return nil, err
		}
		r = runLost(ll, g.spec.name, g.admin, g.lostWatchdog, g.p)
		r.Mechanism = cmpOr(g.spec.lostMechanism, r.Mechanism)
		if err := ll.close(); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("peerbench: unknown step %q", step)
	}
	r.Descriptor = g.spec.desc
	return []Result{r}, nil
}

func (g *goRunner) close() error { return g.l.close() }

// javaRunner drives the Redisson harness's serve mode: one command line per
// step on its stdin, result lines then "end" on its stdout.
type javaRunner struct {
	cmd      *exec.Cmd
	in       io.WriteCloser
	out      *bufio.Scanner
	versions map[string]string
	timeout  time.Duration
}

func startJava(o options) (*javaRunner, error) {
	argv := append(strings.Fields(o.java), "serve",
		"--redis", o.addr,
		"--duration-ms", fmt.Sprint(o.duration.Milliseconds()),
		"--warmup-ms", fmt.Sprint(o.warmup.Milliseconds()),
		"--hold-work-us", fmt.Sprint(o.holdWork.Microseconds()),
		"--lost-watchdog-ms", fmt.Sprint(o.lostWatchdog.Milliseconds()),
		"--trials", fmt.Sprint(o.trials))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	j := &javaRunner{cmd: cmd, in: in, out: sc, versions: map[string]string{},
		timeout: 10*o.duration + 3*o.warmup + time.Duration(o.trials+2)*3*o.lostWatchdog + 2*time.Minute}
	if _, err := j.collect(); err != nil {
		_ = j.close()
		return nil, err
	}
	return j, nil
}

func (j *javaRunner) name() string         { return redissonName }
func (j *javaRunner) has(step string) bool { return true }

func (j *javaRunner) run(step string) ([]Result, error) {
	if _, err := io.WriteString(j.in, step+"\n"); err != nil {
		return nil, err
	}
	return j.collect()
}

// collect reads result lines up to "end", bounded by j.timeout.
func (j *javaRunner) collect() ([]Result, error) {
	type answer struct {
		rs  []Result
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		var a answer
		for j.out.Scan() {
			line := strings.TrimSpace(j.out.Text())
			if line == "end" {
				ch <- a
				return
			}
			if !strings.HasPrefix(line, "{") {
				continue
			}
			var probe map[string]json.RawMessage
			if err := json.Unmarshal([]byte(line), &probe); err != nil {
				a.err = errors.Join(a.err, fmt.Errorf("%q: %w", line, err))
				continue
			}
			if v, ok := probe["versions"]; ok {
				a.err = errors.Join(a.err, json.Unmarshal(v, &j.versions))
				continue
			}
			var r Result
			if err := json.Unmarshal([]byte(line), &r); err != nil {
				a.err = errors.Join(a.err, err)
				continue
			}
			a.rs = append(a.rs, r)
		}
		a.err = errors.Join(a.err, fmt.Errorf("peerbench: redisson harness ended: %v", j.out.Err()))
		ch <- a
	}()
	select {
	case a := <-ch:
		return a.rs, a.err
	case <-time.After(j.timeout):
		_ = j.cmd.Process.Kill()
		<-ch
		return nil, errors.New("peerbench: redisson harness timed out")
	}
}

func (j *javaRunner) close() error {
	_, _ = io.WriteString(j.in, "quit\n")
	_ = j.in.Close()
	done := make(chan error, 1)
	go func() { done <- j.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(30 * time.Second):
		_ = j.cmd.Process.Kill()
		return <-done
	}
}

// median keeps, for each library and workload measured in several rounds,
// the round with the median throughput, and records the rounds' spread.
func median(rs []Result) []Result {
	type k struct{ lib, wl string }
	groups := map[k][]Result{}
	var order []k
	for _, r := range rs {
		key := k{r.Library, r.Workload}
		if _, ok := groups[key]; !ok {
			order = append(order, key)
		}
		groups[key] = append(groups[key], r)
	}
	out := make([]Result, 0, len(order))
	for _, key := range order {
		g := groups[key]
		if len(g) == 1 {
			out = append(out, g[0])
			continue
		}
		slices.SortStableFunc(g, func(a, b Result) int {
			switch {
			case a.Error != "" && b.Error == "":
				return 1
			case a.Error == "" && b.Error != "":
				return -1
			case a.OpsPerS < b.OpsPerS:
				return -1
			case a.OpsPerS > b.OpsPerS:
				return 1
			}
			return 0
		})
		ok := g
		for len(ok) > 0 && ok[len(ok)-1].Error != "" {
			ok = ok[:len(ok)-1]
		}
		if len(ok) == 0 {
			out = append(out, g[0])
			continue
		}
		m := ok[(len(ok)-1)/2]
		m.Rounds = len(g)
		m.OpsPerSMin, m.OpsPerSMax = ok[0].OpsPerS, ok[len(ok)-1].OpsPerS
		if len(ok) < len(g) {
			m.Note = fmt.Sprintf("%d of %d rounds failed: %s", len(g)-len(ok), len(g), g[len(g)-1].Error)
		}
		out = append(out, m)
	}
	return out
}

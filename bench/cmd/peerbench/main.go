// Command peerbench runs the same lock workloads against the raw Redis floor,
// our Redis Locker, redsync v4, bsm/redislock and (through the Java harness in
// bench/redisson) Redisson's RLock, all against one Redis, and writes a
// markdown table, a JSON file and an SVG chart of handoff latency.
//
// Workloads (issue 8):
//
//	a  uncontended acquire+release, 1 worker: pairs/s, p50/p99 latency
//	b  16 workers on distinct keys: pairs/s
//	c  4 and 32 workers on one key, each holding 1 ms: acquisitions/s,
//	   handoff p50/p99 (release start to the next acquire), fairness
//	d  10,000 watchdog-held locks in one process: CPU s, Redis commands/s,
//	   RSS, goroutines/threads (one child process per library)
//	e  lost-lock detection: the key deleted behind the holder's back, time
//	   until the holder knows
//
// Usage: see bench/README.md; bench/run-peers starts a Redis and runs it all.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "peerbench:", err)
		os.Exit(1)
	}
}

type options struct {
	addr         string
	duration     time.Duration
	warmup       time.Duration
	holdWork     time.Duration
	holdDuration time.Duration
	locks        int
	lostWatchdog time.Duration
	trials       int
	workloads    string
	only         string
	java         string
	out          string
	command      string
	childHold    string
	load         string
	cpuProfile   string
	rounds       int
	render       string
}

func run(args []string) error {
	var o options
	fs := flag.NewFlagSet("peerbench", flag.ContinueOnError)
	fs.StringVar(&o.addr, "redis", "127.0.0.1:16390", "Redis host:port (a Redis of the benchmark's own)")
	fs.DurationVar(&o.duration, "duration", 2*time.Second, "measured window of workloads a, b, c (each round)")
	fs.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "warm-up before a (half of it before b and c)")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds of a, b, c; each library's median round is reported")
	fs.DurationVar(&o.holdWork, "hold-work", time.Millisecond, "time a contended holder keeps the lock (c)")
	fs.DurationVar(&o.holdDuration, "hold-duration", 60*time.Second, "measured window of workload d")
	fs.IntVar(&o.locks, "locks", 10000, "watchdog-held locks in workload d")
	fs.DurationVar(&o.lostWatchdog, "lost-watchdog", 3*time.Second, "watchdog timeout (TTL) in workload e; detection bound is 3x")
	fs.IntVar(&o.trials, "trials", 5, "lost-lock trials per library (e)")
	fs.StringVar(&o.workloads, "workloads", "abcde", "workloads to run, letters a..e")
	fs.StringVar(&o.only, "libs", "", "comma-separated library names to run (default all)")
	fs.StringVar(&o.java, "java", "", "command line of the Redisson harness (empty: skip Redisson)")
	fs.StringVar(&o.out, "out", "bench/results", "directory for peers.md, peers.json, handoff.svg")
	fs.StringVar(&o.command, "command", "", "the command line to record in the report")
	fs.StringVar(&o.load, "load-note", "", "a note on machine load to record in the report")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process (workloads a, b, c, e) to this file")
	fs.StringVar(&o.render, "render", "", "re-render peers.md and handoff.svg from this peers.json, then exit")
	fs.StringVar(&o.childHold, "child-hold", "", "internal: run as the workload-d child for this library")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := libConfig{addr: o.addr, ttl: 30 * time.Second, watchdog: 30 * time.Second, wait: 5 * time.Second}

	if o.childHold != "" {
		spec, err := findLib(o.childHold)
		if err != nil {
			return err
		}
		return runHoldChild(spec, cfg, o.locks)
	}

	if o.render != "" {
		b, err := os.ReadFile(o.render)
		if err != nil {
			return err
		}
		var rep report
		if err := json.Unmarshal(b, &rep); err != nil {
			return fmt.Errorf("%s: %w", o.render, err)
		}
		return rep.write(o.out)
	}

	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	admin := redis.NewClient(&redis.Options{Addr: o.addr})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis %s: %w", o.addr, err)
	}
	rep := report{Meta: collectMeta(ctx, admin, o)}
	p := params{duration: o.duration, warmup: o.warmup, holdWork: o.holdWork, trials: o.trials, maxSamples: 2_000_000}
	want := func(spec string, w byte) bool {
		return strings.IndexByte(o.workloads, w) >= 0 && strings.IndexByte(spec, w) >= 0
	}
	selected := func(name string) bool {
		if o.only == "" {
			return true
		}
		for _, n := range strings.Split(o.only, ",") {
			if strings.TrimSpace(n) == name {
				return true
			}
		}
		return false
	}
	logf := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
	}

	// a, b, c in rounds, interleaving the libraries (Redisson too, through
	// its serve mode); then e once per library.
	var runners []runner
	defer func() {
		for _, r := range runners {
			_ = r.close()
		}
	}()
	if strings.ContainsAny(o.workloads, "abce") {
		for _, spec := range libs {
			if selected(spec.name) {
				g, err := newGoRunner(spec, cfg, p, admin, o.lostWatchdog)
				if err != nil {
					return err
				}
				runners = append(runners, g)
			}
		}
		if o.java != "" && selected(redissonName) {
			j, err := startJava(o)
			if err != nil {
				return fmt.Errorf("redisson harness: %w", err)
			}
			for k, v := range j.versions {
				rep.Meta.Versions[k] = v
			}
			runners = append(runners, j)
		}
	}
	var rounds []Result
	for round := range o.rounds {
		for _, step := range []string{"a", "b", "c4", "c32"} {
			if strings.IndexByte(o.workloads, step[0]) < 0 {
				continue
			}
			// Rotate the order each round, so no library always runs first.
			for i := range runners {
				rn := runners[(i+round)%len(runners)]
				if !rn.has(step) {
					continue
				}
				rs, err := rn.run(step)
				if err != nil {
					return fmt.Errorf("%s %s: %w", rn.name(), step, err)
				}
				for _, r := range rs {
					logf("round %d %-22s %-16s %s", round+1, r.Library, r.Workload, r.brief())
				}
				rounds = append(rounds, rs...)
			}
		}
	}
	rep.Results = append(rep.Results, median(rounds)...)
	if strings.IndexByte(o.workloads, 'e') >= 0 {
		for _, rn := range runners {
			if !rn.has("e") {
				continue
			}
			rs, err := rn.run("e")
			if err != nil {
				return fmt.Errorf("%s e: %w", rn.name(), err)
			}
			for _, r := range rs {
				logf("%-22s %-16s %s", r.Library, r.Workload, r.brief())
			}
			rep.Results = append(rep.Results, rs...)
		}
	}
	for _, r := range runners {
		if err := r.close(); err != nil {
			return fmt.Errorf("%s: %w", r.name(), err)
		}
	}
	runners = nil

	// d: a child process per library.
	if strings.IndexByte(o.workloads, 'd') >= 0 {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		for _, spec := range libs {
			if !selected(spec.name) || !want(spec.workloads, 'd') {
				continue
			}
			cmd := exec.Command(self, "-redis", o.addr, "-locks", fmt.Sprint(o.locks), "-child-hold", spec.name)
			r := measureHold(spec.name, cmd, admin, o.locks, o.holdDuration)
			r.Descriptor = spec.holdDesc
			logf("%-22s %-16s %s", spec.name, r.Workload, r.brief())
			rep.Results = append(rep.Results, r)
			if err := admin.FlushDB(ctx).Err(); err != nil {
				return err
			}
		}
		if o.java != "" && selected(redissonName) {
			argv := append(strings.Fields(o.java), "hold", "--redis", o.addr, "--n", fmt.Sprint(o.locks))
			cmd := exec.Command(argv[0], argv[1:]...)
			r := measureHold("redisson", cmd, admin, o.locks, o.holdDuration)
			r.Descriptor = "Redisson RLock.lock() (watchdog, default 30 s)"
			logf("%-22s %-16s %s", "redisson", r.Workload, r.brief())
			rep.Results = append(rep.Results, r)
		}
	}
	rep.Meta.LoadEnd = loadAvg()
	rep.Meta.Finished = time.Now().UTC().Format(time.RFC3339)
	return rep.write(o.out)
}

// Meta records where and how the figures were measured.
type Meta struct {
	Started   string            `json:"started"`
	Finished  string            `json:"finished"`
	Command   string            `json:"command"`
	CPU       string            `json:"cpu"`
	Cores     int               `json:"cores"`
	MemoryGiB float64           `json:"memory_gib"`
	Kernel    string            `json:"kernel"`
	LoadStart string            `json:"load_start"`
	LoadEnd   string            `json:"load_end"`
	LoadNote  string            `json:"load_note,omitempty"`
	Versions  map[string]string `json:"versions"`
	Params    map[string]string `json:"params"`
}

func collectMeta(ctx context.Context, admin *redis.Client, o options) Meta {
	m := Meta{
		Started:   time.Now().UTC().Format(time.RFC3339),
		Command:   o.command,
		Cores:     runtime.NumCPU(),
		LoadStart: loadAvg(),
		LoadNote:  o.load,
		Versions:  map[string]string{"go": runtime.Version()},
		Params: map[string]string{
			"duration":      o.duration.String(),
			"rounds":        fmt.Sprint(o.rounds),
			"warmup":        o.warmup.String(),
			"hold_work":     o.holdWork.String(),
			"hold_duration": o.holdDuration.String(),
			"locks":         fmt.Sprint(o.locks),
			"lost_watchdog": o.lostWatchdog.String(),
			"trials":        fmt.Sprint(o.trials),
			"explicit_ttl":  "30s",
			"hold_watchdog": "30s",
			"wait":          "5s",
		},
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				m.CPU = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %f kB", &kb); err == nil {
			m.MemoryGiB = float64(int(kb/1024/1024*10)) / 10
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if info, err := admin.Info(ctx, "server").Result(); err == nil {
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				m.Versions["redis-server"] = v
			}
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/go-redsync/redsync/v4", "github.com/bsm/redislock", "github.com/redis/go-redis/v9":
				m.Versions[d.Path] = d.Version
			}
		}
	}
	return m
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// quietLogger is the logger handed to libraries that take one.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

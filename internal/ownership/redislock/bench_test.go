package redislock

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// Benchmarks against the real Redis of COORDINATOR_TEST_REDIS_URL. Figures
// and commands: bench/notes/ownership.md.

func benchLocker(b *testing.B, env *testenv.RedisEnv, owner string, ttl time.Duration) (*Locker, redis.UniversalClient) {
	b.Helper()
	client, err := NewClient(env.URL, ModeSingle)
	if err != nil {
		b.Fatal(err)
	}
	l, err := New(client, Config{Prefix: env.Prefix, Owner: owner, WaitTime: 30 * time.Second, WatchdogTimeout: ttl})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close(); _ = client.Close() })
	return l, client
}

// BenchmarkAcquireRelease: uncontended acquire+release pairs, each
// goroutine on its own key, for the watchdog and the explicit lease,
// against the raw floor in the same run: go-redis SET NX PX, then a Lua
// compare-and-delete (EVALSHA), on the same Redis with the same client
// options. The two alternate in slices of 100 pairs per goroutine, so load
// from elsewhere on the machine hits both alike. Reports pairs/s of each
// and their ratio (ours/floor; the target is 0.9 or more).
func BenchmarkAcquireRelease(b *testing.B) {
	del := redis.NewScript(`if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0`)
	for _, lease := range []time.Duration{0, 30 * time.Second} {
		for _, g := range []int{1, 16} {
			name := fmt.Sprintf("lease=%s/goroutines=%d", map[bool]string{true: "watchdog", false: "explicit"}[lease == 0], g)
			b.Run(name, func(b *testing.B) {
				env := testenv.Redis(b)
				l, _ := benchLocker(b, env, "bench", 30*time.Second)
				raw, err := NewClient(env.URL, ModeSingle)
				if err != nil {
					b.Fatal(err)
				}
				defer raw.Close()
				ctx := context.Background()
				var seq atomic.Int64
				ours := func(key string) error {
					le, err := l.Acquire(ctx, key, lease)
					if err != nil {
						return err
					}
					return le.Release(ctx)
				}
				floor := func(key string) error {
					k := env.Prefix + ":raw:" + key
					tok := strconv.FormatInt(seq.Add(1), 10)
					ok, err := raw.SetNX(ctx, k, tok, 30*time.Second).Result()
					if err != nil || !ok {
						return fmt.Errorf("setnx %v %v", ok, err)
					}
					return del.Run(ctx, raw, []string{k}, tok).Err()
				}
				// Our two Lua scripts called bare, without the Locker around
				// them (now and before issue 18): separates the scripts' cost
				// from the Locker's.
				scripts := barePair(l, raw, false)
				bare18 := barePair(l, raw, true)
				before18 := func(key string) error { return bare18("b18-" + key) }
				// Warm all (connections, script cache).
				for w := range g {
					_ = ours("warm-" + strconv.Itoa(w))
					_ = floor("warm-" + strconv.Itoa(w))
					_ = scripts("warm-" + strconv.Itoa(w))
					_ = before18("warm-" + strconv.Itoa(w))
				}
				b.ResetTimer()
				var tOurs, tFloor, tScripts, tBefore18 time.Duration
				const slice = 100
				for done := 0; done < b.N; done += slice * g {
					n := min(slice, (b.N-done+g-1)/g)
					tOurs += runPairs(b, g, n, ours)
					tFloor += runPairs(b, g, n, floor)
					tScripts += runPairs(b, g, n, scripts)
					tBefore18 += runPairs(b, g, n, before18)
				}
				b.StopTimer()
				pOurs := float64(b.N) / tOurs.Seconds()
				pFloor := float64(b.N) / tFloor.Seconds()
				b.ReportMetric(pOurs, "pairs/s")
				b.ReportMetric(pFloor, "floor-pairs/s")
				b.ReportMetric(float64(b.N)/tScripts.Seconds(), "scripts-pairs/s")
				b.ReportMetric(float64(b.N)/tBefore18.Seconds(), "before18-scripts-pairs/s")
				b.ReportMetric(tFloor.Seconds()/tScripts.Seconds(), "scripts-ratio")
				b.ReportMetric(tFloor.Seconds()/tBefore18.Seconds(), "before18-scripts-ratio")
				b.ReportMetric(pOurs/pFloor, "ratio")
			})
		}
	}
}

// runPairs runs n pairs on each of g goroutines (a key each) and returns the wall time.
func runPairs(b *testing.B, g, n int, pair func(key string) error) time.Duration {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, g)
	start := time.Now()
	for w := range g {
		wg.Go(func() {
			key := "pair-" + strconv.Itoa(w)
			for range n {
				if err := pair(key); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return el
}

// BenchmarkContendedHandoff: workers on one key, each holding it 1ms per
// turn. Reports the wait to acquire (p50/p99/max), the handoff latency (the
// holder's Release call to the next holder's Acquire return, p50/p99), the
// smallest and largest share of turns any worker got, and fairness = the
// largest over the smallest number of turns (1.0 is perfect). lockers=1:
// the workers share one Locker (one process); lockers=workers: a Locker
// (and client) each, as replicas in separate processes.
func BenchmarkContendedHandoff(b *testing.B) {
	for _, c := range []struct{ lockers, workers int }{{1, 4}, {4, 4}, {32, 32}} {
		b.Run(fmt.Sprintf("lockers=%d/workers=%d", c.lockers, c.workers), func(b *testing.B) {
			workers := c.workers
			const hold = time.Millisecond
			env := testenv.Redis(b)
			ls := make([]*Locker, c.lockers)
			for i := range ls {
				ls[i], _ = benchLocker(b, env, "w"+strconv.Itoa(i), 30*time.Second)
			}
			ctx := context.Background()
			var released atomic.Int64 // unix nanos when the last Release started
			var mu sync.Mutex
			var waits, handoffs []time.Duration
			turns := make([]int, workers)
			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			b.ResetTimer()
			for w := range workers {
				l := ls[w%c.lockers]
				wg.Go(func() {
					for next.Add(1) <= int64(b.N) {
						start := time.Now()
						le, err := l.Acquire(ctx, "hot", 0)
						got := time.Now()
						if err != nil {
							errs <- err
							return
						}
						rel := released.Load()
						mu.Lock()
						waits = append(waits, got.Sub(start))
						if rel > 0 {
							handoffs = append(handoffs, got.Sub(time.Unix(0, rel)))
						}
						turns[w]++
						mu.Unlock()
						for t0 := time.Now(); time.Since(t0) < hold; {
							runtime.Gosched() // hold the lock 1ms, keeping the CPU for others
						}
						released.Store(time.Now().UnixNano())
						if err := le.Release(ctx); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
			slices.Sort(waits)
			slices.Sort(handoffs)
			b.ReportMetric(us(pct(waits, 50)), "wait-p50-us")
			b.ReportMetric(us(pct(waits, 99)), "wait-p99-us")
			b.ReportMetric(us(pct(waits, 100)), "wait-max-us")
			b.ReportMetric(us(pct(handoffs, 50)), "handoff-p50-us")
			b.ReportMetric(us(pct(handoffs, 99)), "handoff-p99-us")
			lo, hi := slices.Min(turns), slices.Max(turns)
			b.ReportMetric(float64(lo)/float64(b.N), "min-share")
			b.ReportMetric(float64(hi)/float64(b.N), "max-share")
			b.ReportMetric(float64(hi)/float64(max(lo, 1)), "fairness")
		})
	}
}

func pct(s []time.Duration, p int) time.Duration {
	if len(s) == 0 {
		return 0
	}
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// BenchmarkWatchdog10k: 10,000 watchdog leases held at once by one Locker.
// Each op is one renewal round of all of them; reports the process CPU per
// round and the goroutines the Locker runs (one renewal loop, not one per
// lease).
func BenchmarkWatchdog10k(b *testing.B) {
	const leases = 10000
	env := testenv.Redis(b)
	l, _ := benchLocker(b, env, "many", time.Minute) // rounds driven by the benchmark, not the ticker
	ctx := context.Background()
	held := make([]ownership.Lease, 0, leases)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1); i <= leases; i = next.Add(1) {
				le, err := l.Acquire(ctx, "lease-"+strconv.FormatInt(i, 10), 0)
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				held = append(held, le)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(held) != leases {
		b.Fatalf("held %d leases", len(held))
	}
	// All goroutines of the test process while 10k leases are held: the
	// testing framework's, go-redis's and the Locker's two (renewal loop,
	// subscription). One per lease would make it 10,000+.
	goroutines := runtime.NumGoroutine()
	cpu0 := cpuTime()
	b.ResetTimer()
	for range b.N {
		l.renewRound(time.Minute)
	}
	b.StopTimer()
	cpu := cpuTime() - cpu0
	for _, le := range held {
		if le.Err() != nil {
			b.Fatalf("lease lost: %v", le.Err())
		}
	}
	b.ReportMetric(float64(cpu)/float64(time.Millisecond)/float64(b.N), "cpu-ms/round")
	b.ReportMetric(float64(goroutines), "goroutines-in-process")
	b.ReportMetric(float64(leases), "leases")
	for _, le := range held {
		_ = le.Release(ctx)
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// barePair returns one uncontended acquire+release of the lock scripts
// called bare (no Locker around them) on a key: the current scripts, or
// with before18 the scripts before issue 18 (before18_test.go).
func barePair(l *Locker, c redis.Scripter, before18 bool) func(key string) error {
	ctx := context.Background()
	var seq atomic.Int64
	return func(key string) error {
		queue, tickets := l.queueKeys(key)
		tok := "bare:" + strconv.FormatInt(seq.Add(1), 10)
		if before18 {
			res, err := before18AcquireScript.Run(ctx, c, []string{l.lockKey(key), l.fenceKey(key), queue, tickets},
				tok, "bench", 30000, "bare", 0, queueMS, "0").Slice()
			if err != nil {
				return err
			}
			fence, _ := res[1].(int64)
			return before18ReleaseScript.Run(ctx, c, []string{l.lockKey(key), queue, tickets, l.endedKey(key, fence)},
				tok, fence, endedMS, handoffMS, l.cfg.Prefix, key).Err()
		}
		f, err := acquireScript.Run(ctx, c, []string{l.lockKey(key), l.fenceKey(key), queue, tickets},
			tok, "bench", 30000, "0").Text()
		if err != nil {
			return err
		}
		fence, err := fenceOf(f)
		if err != nil {
			return err
		}
		return releaseScript.Run(ctx, c, []string{l.lockKey(key), queue, tickets, l.endedKey(key, fence)},
			tok, fence).Err()
	}
}

// functionPair loads the current acquire and release scripts as a Redis 7
// function library (FUNCTION LOAD; the bodies unchanged, KEYS and ARGV
// become the functions' parameters) and returns one uncontended pair of
// them through FCALL: does FCALL cost Redis less than EVALSHA?
func functionPair(b *testing.B, l *Locker, c redis.UniversalClient) func(key string) error {
	b.Helper()
	ctx := context.Background()
	lib := "#!lua name=coordinator_bench\n" +
		"redis.register_function('bench_acquire', function(KEYS, ARGV)\n" + acquireLua + "\nend)\n" +
		"redis.register_function('bench_release', function(KEYS, ARGV)\n" + releaseLua + "\nend)\n"
	if err := c.FunctionLoadReplace(ctx, lib).Err(); err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64
	return func(key string) error {
		queue, tickets := l.queueKeys(key)
		tok := "fcall:" + strconv.FormatInt(seq.Add(1), 10)
		f, err := c.FCall(ctx, "bench_acquire", []string{l.lockKey(key), l.fenceKey(key), queue, tickets},
			tok, "bench", 30000, "0").Text()
		if err != nil {
			return err
		}
		fence, err := fenceOf(f)
		if err != nil {
			return err
		}
		return c.FCall(ctx, "bench_release", []string{l.lockKey(key), queue, tickets, l.endedKey(key, fence)},
			tok, fence).Err()
	}
}

// BenchmarkServerCost: Redis's cost per uncontended acquire+release pair,
// for the raw floor (SET NX PX + a Lua compare-and-delete), our scripts
// before issue 18 and now, called bare (and now through FCALL), and our Locker (explicit and
// watchdog lease), on a redis-server of the benchmark's own. Reported:
//
//   - server-us/pair: usec of the pair's top-level commands in INFO
//     commandstats (wall time inside each command: a busy machine that
//     preempts Redis mid-script inflates it);
//   - server-cpu-us/pair: the redis-server process's user+system CPU
//     (/proc/PID/stat), network I/O included, not inflated by preemption
//     (10 ms ticks: use 20000 pairs or more);
//   - redis-instr/pair, when the server runs under callgrind
//     (bench/redis-callgrind): instructions the server executed, which no
//     load on the machine changes.
func BenchmarkServerCost(b *testing.B) {
	var (
		env *testenv.RedisEnv
		pid int
		cg  bool
	)
	if url := os.Getenv("COORDINATOR_BENCH_CALLGRIND_URL"); url != "" {
		var err error
		pid, err = strconv.Atoi(os.Getenv("COORDINATOR_BENCH_CALLGRIND_PID"))
		if err != nil {
			b.Fatalf("COORDINATOR_BENCH_CALLGRIND_PID: %v", err)
		}
		opt, err := redis.ParseURL(url)
		if err != nil {
			b.Fatalf("COORDINATOR_BENCH_CALLGRIND_URL: %v", err)
		}
		c := redis.NewClient(opt)
		b.Cleanup(func() { _ = c.Close() })
		env, cg = &testenv.RedisEnv{URL: url, Client: c, Prefix: testenv.UniqueName("cost")}, true
	} else {
		srv := testenv.StartRedisServer(b)
		env, pid = &testenv.RedisEnv{URL: srv.URL(), Client: srv.Client(b), Prefix: "cost"}, srv.PID()
	}
	l, raw := benchLocker(b, env, "bench", 30*time.Second)
	ctx := context.Background()
	del := redis.NewScript(`if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0`)
	rawKey := env.Prefix + ":raw"
	bare18, bareNow := barePair(l, raw, true), barePair(l, raw, false)
	fcallPair := functionPair(b, l, raw)
	floor := func(key string) error {
		if err := raw.SetNX(ctx, rawKey+key, "t", 30*time.Second).Err(); err != nil {
			return err
		}
		return del.Run(ctx, raw, []string{rawKey + key}, "t").Err()
	}
	explicit := func(key string) error {
		le, err := l.Acquire(ctx, key, 30*time.Second)
		if err != nil {
			return err
		}
		return le.Release(ctx)
	}
	pairs := map[string]func(key string) error{
		"floor":            floor,
		"scripts-before18": func(key string) error { return bare18("before" + key) },
		"scripts":          func(key string) error { return bareNow("now" + key) },
		"scripts-fcall":    func(key string) error { return fcallPair("fcall" + key) },
		"ours-explicit":    explicit,
		"ours-watchdog": func(key string) error {
			le, err := l.Acquire(ctx, key, 0)
			if err != nil {
				return err
			}
			return le.Release(ctx)
		},
		// 16 goroutines, a key each, in one process: the Locker's calls
		// go out in shared pipelines (coalesce.go), the floor's each alone.
		"floor/16":         floor,
		"ours-explicit/16": explicit,
	}
	topLevel := map[string][]string{"floor": {"set", "evalsha", "eval"}, "floor/16": {"set", "evalsha", "eval"}, "scripts-fcall": {"fcall"}}
	for _, name := range []string{"floor", "scripts-before18", "scripts", "scripts-fcall", "ours-explicit", "ours-watchdog", "floor/16", "ours-explicit/16"} {
		b.Run(name, func(b *testing.B) {
			pair := pairs[name]
			g := 1
			if _, n, ok := strings.Cut(name, "/"); ok {
				g, _ = strconv.Atoi(n)
			}
			for w := range g { // warm: scripts cached, connections open, server state read
				for range 100 {
					if err := pair("k" + strconv.Itoa(w)); err != nil {
						b.Fatal(err)
					}
				}
			}
			if err := env.Client.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			if cg {
				callgrind(b, "-z", pid)
			}
			cpu0 := procCPU(b, pid)
			b.ResetTimer()
			var wg sync.WaitGroup
			for w := range g {
				wg.Go(func() {
					for range (b.N + g - 1 - w) / g {
						if err := pair("k" + strconv.Itoa(w)); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			cpu := procCPU(b, pid) - cpu0
			if cg {
				b.ReportMetric(float64(callgrind(b, "-e", pid))/float64(b.N), "redis-instr/pair")
			}
			info, err := env.Client.Info(ctx, "commandstats").Result()
			if err != nil {
				b.Fatal(err)
			}
			var usec float64
			for _, line := range strings.Split(info, "\n") {
				cmds, ok := topLevel[name]
				if !ok {
					cmds = []string{"evalsha", "eval"}
				}
				for _, cmd := range cmds {
					if v, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
						i := strings.Index(v, "usec=")
						v = v[i+5:]
						n, _ := strconv.ParseFloat(v[:strings.IndexByte(v, ',')], 64)
						usec += n
					}
				}
			}
			b.ReportMetric(usec/float64(b.N), "server-us/pair")
			b.ReportMetric(float64(cpu)/float64(time.Microsecond)/float64(b.N), "server-cpu-us/pair")
		})
	}
}

// procCPU is the user+system CPU time of process pid (clock ticks of 10 ms).
func procCPU(b *testing.B, pid int) time.Duration {
	b.Helper()
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name in parentheses: state is the first;
	// utime and stime are the 12th and 13th.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// callgrind runs callgrind_control with op on pid: -z zeroes the counters,
// -e returns the instructions counted since (summed over threads).
func callgrind(b *testing.B, op string, pid int) int64 {
	b.Helper()
	out, err := exec.Command("callgrind_control", op, strconv.Itoa(pid)).CombinedOutput()
	if err != nil {
		b.Fatalf("callgrind_control %s: %v: %s", op, err, out)
	}
	var total int64
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "Th" {
			n, _ := strconv.ParseInt(strings.ReplaceAll(f[2], ",", ""), 10, 64)
			total += n
		}
	}
	if op == "-e" && total == 0 {
		b.Fatalf("callgrind_control -e: no totals in %q", out)
	}
	return total
}

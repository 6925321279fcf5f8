package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Result is one row of the report: one library on one workload. Fields that
// do not apply to a workload are zero and omitted from JSON. The Java
// harness writes the same keys.
type Result struct {
	Library  string `json:"library"`
	Workload string `json:"workload"`
	Workers  int    `json:"workers,omitempty"`
	// Seconds is the measured window.
	Seconds float64 `json:"seconds,omitempty"`
	// Ops counts acquire+release pairs (a, b) or acquisitions (c).
	Ops      int64   `json:"ops,omitempty"`
	Failures int64   `json:"failures,omitempty"`
	OpsPerS  float64 `json:"ops_per_s,omitempty"`
	// Rounds this row is the median of (by OpsPerS), and their spread.
	Rounds     int     `json:"rounds,omitempty"`
	OpsPerSMin float64 `json:"ops_per_s_min,omitempty"`
	OpsPerSMax float64 `json:"ops_per_s_max,omitempty"`
	// P50us/P99us: acquire+release pair latency (a).
	P50us float64 `json:"p50_us,omitempty"`
	P99us float64 `json:"p99_us,omitempty"`
	// Handoff: from the holder starting its release to the acquire of the
	// next holder, another worker, returning (c).
	HandoffP50us float64 `json:"handoff_p50_us,omitempty"`
	HandoffP99us float64 `json:"handoff_p99_us,omitempty"`
	// SelfReacquire is the share of acquisitions taken by the worker that
	// had just released the lock (barging).
	SelfReacquire float64 `json:"self_reacquire,omitempty"`
	MinPerWorker  int64   `json:"min_per_worker,omitempty"`
	MaxPerWorker  int64   `json:"max_per_worker,omitempty"`
	// Fairness is max/min acquisitions per worker (1 = perfectly fair; 0
	// with min 0 means some worker never got the lock).
	Fairness float64 `json:"fairness,omitempty"`
	// Overlaps counts times two workers were inside the critical section at
	// once (must be 0).
	Overlaps int64 `json:"overlaps,omitempty"`
	// Hold workload (d).
	Locks       int     `json:"locks,omitempty"`
	CPUSeconds  float64 `json:"cpu_s,omitempty"`
	RedisCmdsPS float64 `json:"redis_cmds_per_s,omitempty"`
	// RedisScriptsPS counts EVAL/EVALSHA calls (pipelined calls each count).
	RedisScriptsPS float64 `json:"redis_scripts_per_s,omitempty"`
	RSSBytes       int64   `json:"rss_bytes,omitempty"`
	Goroutines     int     `json:"goroutines,omitempty"`
	Threads        int     `json:"threads,omitempty"`
	LostDuring     int     `json:"lost_during,omitempty"`
	AcquireSecs    float64 `json:"acquire_s,omitempty"`
	// Lost-lock detection (e): ms from the key's deletion until the holder
	// knows, over Trials; Detected of them were noticed within BoundMs.
	Trials     int     `json:"trials,omitempty"`
	Detected   int     `json:"detected"`
	DetectP50  float64 `json:"detect_p50_ms,omitempty"`
	DetectMax  float64 `json:"detect_max_ms,omitempty"`
	BoundMs    float64 `json:"bound_ms,omitempty"`
	Mechanism  string  `json:"mechanism,omitempty"`
	Note       string  `json:"note,omitempty"`
	Error      string  `json:"error,omitempty"`
	Descriptor string  `json:"desc,omitempty"`
}

// Workload ids, in report order.
const (
	wUncontended = "a_uncontended_1w"
	wDistinct    = "b_distinct_16w"
	wContended4  = "c_contended_4w"
	wContended32 = "c_contended_32w"
	wHold        = "d_hold_10k"
	wLost        = "e_lost_lock"
)

type params struct {
	duration time.Duration // measured window of a, b, c
	warmup   time.Duration
	holdWork time.Duration // time each contended holder keeps the lock (1 ms)
	trials   int           // lost-lock trials
	// maxSamples bounds the latency slices.
	maxSamples int
}

// pct returns the q-quantile (nearest rank) of sorted, in microseconds.
func pct(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	i = min(max(i, 0), len(sorted)-1)
	return float64(sorted[i]) / float64(time.Microsecond)
}

// warm runs pairs on key for d, so connection pools, script caches and (for
// the JVM) the JIT are warm before a measured window.
func warm(l lib, key string, d time.Duration) {
	ctx := context.Background()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		h, err := l.lock(ctx, key)
		if err != nil {
			continue
		}
		_ = h.release(ctx)
	}
}

// runUncontended is (a): one worker, one key, acquire+release back to back.
func runUncontended(l lib, name string, p params) Result {
	r := Result{Library: name, Workload: wUncontended, Workers: 1}
	key := "a-uncontended"
	warm(l, key, p.warmup)
	ctx := context.Background()
	lat := make([]time.Duration, 0, p.maxSamples)
	start := time.Now()
	end := start.Add(p.duration)
	var firstErr error
	for len(lat) < p.maxSamples {
		t0 := time.Now()
		if !t0.Before(end) {
			break
		}
		h, err := l.lock(ctx, key)
		if err != nil {
			r.Failures++
			firstErr = cmpErr(firstErr, err)
			continue
		}
		if err := h.release(ctx); err != nil {
			r.Failures++
			firstErr = cmpErr(firstErr, err)
			continue
		}
		lat = append(lat, time.Since(t0))
	}
	elapsed := time.Since(start)
	slices.Sort(lat)
	r.Seconds = elapsed.Seconds()
	r.Ops = int64(len(lat))
	r.OpsPerS = float64(r.Ops) / elapsed.Seconds()
	r.P50us, r.P99us = pct(lat, 0.50), pct(lat, 0.99)
	r.Error = errString(firstErr)
	return r
}

// runDistinct is (b): workers goroutines, each on its own key.
func runDistinct(l lib, name string, workers int, p params) Result {
	r := Result{Library: name, Workload: wDistinct, Workers: workers}
	warm(l, "b-distinct-0", p.warmup/2)
	ctx := context.Background()
	counts := make([]int64, workers)
	fails := make([]int64, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(p.duration)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("b-distinct-%d", w)
			for time.Now().Before(end) {
				h, err := l.lock(ctx, key)
				if err != nil {
					fails[w]++
					errs[w] = cmpErr(errs[w], err)
					continue
				}
				if err := h.release(ctx); err != nil {
					fails[w]++
					errs[w] = cmpErr(errs[w], err)
					continue
				}
				counts[w]++
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	for w := range workers {
		r.Ops += counts[w]
		r.Failures += fails[w]
	}
	r.Seconds = elapsed.Seconds()
	r.OpsPerS = float64(r.Ops) / elapsed.Seconds()
	r.Error = errString(errors.Join(errs...))
	return r
}

// runContended is (c): workers goroutines on one key, each holding it for
// p.holdWork per acquisition. Handoff is measured from a holder starting its
// release to the acquire of a waiting worker returning. A worker that takes
// the lock again straight after releasing it (barging) makes no handoff: it
// is counted in SelfReacquire, and the waiters' clock keeps running from the
// first release until one of them gets the lock. So the figure is how long
// waiters take to get a lock that has become free, which is what polling
// costs, and it cannot be flattered by the releaser re-taking the lock.
func runContended(l lib, name string, workers int, p params) Result {
	wl := wContended4
	if workers != 4 {
		wl = wContended32
	}
	r := Result{Library: name, Workload: wl, Workers: workers}
	key := fmt.Sprintf("c-contended-%d", workers)
	warm(l, key, p.warmup/2)

	var (
		mu       sync.Mutex
		inside   int
		overlaps int64
		// freeSince is when the lock first became free for the waiters: the
		// release start of a holder, kept while the same worker takes it
		// again (barging), cleared when another worker gets it.
		freeSince  time.Time
		lastHolder = -1
		selfAgain  int64
		handoffs   = make([]time.Duration, 0, p.maxSamples)
	)
	counts := make([]int64, workers)
	fails := make([]int64, workers)
	errs := make([]error, workers)

	runCtx, cancel := context.WithTimeout(context.Background(), p.duration)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				actx, acancel := context.WithTimeout(context.WithValue(runCtx, workerKey{}, w), 5*time.Second)
				h, err := l.lock(actx, key)
				acancel()
				if err != nil {
					if runCtx.Err() == nil {
						fails[w]++
						errs[w] = cmpErr(errs[w], err)
					}
					continue
				}
				got := time.Now()
				mu.Lock()
				inside++
				if inside > 1 {
					overlaps++
				}
				switch {
				case runCtx.Err() != nil:
				case lastHolder == w:
					selfAgain++
				case !freeSince.IsZero() && len(handoffs) < cap(handoffs):
					handoffs = append(handoffs, got.Sub(freeSince))
				}
				if lastHolder != w {
					freeSince = time.Time{}
				}
				lastHolder = w
				mu.Unlock()

				time.Sleep(p.holdWork) // the work done under the lock

				mu.Lock()
				inside--
				if freeSince.IsZero() {
					freeSince = time.Now()
				}
				mu.Unlock()
				if runCtx.Err() == nil {
					counts[w]++
				}
				rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
				if err := h.release(rctx); err != nil {
					fails[w]++
					errs[w] = cmpErr(errs[w], err)
				}
				rcancel()
			}
		}()
	}
	<-runCtx.Done()
	elapsed := time.Since(start)
	wg.Wait()

	r.MinPerWorker = counts[0]
	for w := range workers {
		r.Ops += counts[w]
		r.Failures += fails[w]
		r.MinPerWorker = min(r.MinPerWorker, counts[w])
		r.MaxPerWorker = max(r.MaxPerWorker, counts[w])
	}
	if r.MinPerWorker > 0 {
		r.Fairness = float64(r.MaxPerWorker) / float64(r.MinPerWorker)
	}
	slices.Sort(handoffs)
	r.Seconds = elapsed.Seconds()
	r.OpsPerS = float64(r.Ops) / elapsed.Seconds()
	r.HandoffP50us, r.HandoffP99us = pct(handoffs, 0.50), pct(handoffs, 0.99)
	r.Overlaps = overlaps
	if r.Ops > 0 {
		r.SelfReacquire = float64(selfAgain) / float64(r.Ops)
	}
	r.Error = errString(errors.Join(errs...))
	return r
}

// runLost is (e): hold a key, delete it behind the holder's back at a random
// point of the renewal period, and time until the holder's lost channel
// closes, bounded by 3 x watchdog.
func runLost(l lib, name string, admin *redis.Client, watchdog time.Duration, p params) Result {
	bound := 3 * watchdog
	r := Result{Library: name, Workload: wLost, BoundMs: ms(bound)}
	ctx := context.Background()
	var det []time.Duration
	for i := range p.trials {
		key := fmt.Sprintf("e-lost-%d", i)
		h, err := l.hold(ctx, key)
		if err != nil {
			r.Error = err.Error()
			return r
		}
		r.Trials++
		if h.lost() == nil {
			r.Mechanism = "none"
			_ = h.release(ctx)
			return r
		}
		// A random phase against the renewal period: a deliberate delay,
		// not a wait for a state.
		time.Sleep(rand.N(watchdog / 3))
		if err := admin.Del(ctx, l.redisKey(key)).Err(); err != nil {
			r.Error = err.Error()
			_ = h.release(ctx)
			return r
		}
		deleted := time.Now()
		timer := time.NewTimer(bound)
		select {
		case <-h.lost():
			det = append(det, time.Since(deleted))
			r.Detected++
		case <-timer.C:
		}
		timer.Stop()
		_ = h.release(ctx) // expected to fail: the lock is gone
		if r.Detected == 0 {
			break // never noticed within the bound: more trials only repeat it
		}
	}
	slices.Sort(det)
	if len(det) > 0 {
		r.DetectP50 = pct(det, 0.5) / 1000
		r.DetectMax = pct(det, 1) / 1000
	}
	return r
}

// workerKey carries a contending worker's index in the acquire context, for
// libraries that give each worker its own client (oursPerWorker).
type workerKey struct{}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

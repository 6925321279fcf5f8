// Package health checks a replica's dependencies (Redis, PostgreSQL, Kafka)
// in the background, on an interval, and keeps the latest result of each.
// Requests never run a check: GET /v1/health reads the cache, and so does
// nothing else, so a thousand callers cost what one does, and a slow or
// locked dependency cannot make a probe time out.
//
// Dependency health is deliberately not readiness (see internal/httpapi):
// every replica shares these dependencies, so taking replicas out of a
// Service when one fails would help nobody and hide the admin API while it
// is needed most. Monitoring alerts on coordinator_dependency_up instead.
package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Config.
const (
	DefaultInterval = 10 * time.Second
	DefaultTimeout  = 2 * time.Second
)

// Check is one dependency. Check returns nil when it is usable.
type Check struct {
	Name  string
	Check func(ctx context.Context) error
}

// Config configures a Monitor.
type Config struct {
	// Checks are the dependencies, in the order they are reported.
	Checks []Check
	// Interval is the pause between two rounds of checks. Default 10s.
	Interval time.Duration
	// Timeout bounds one check. Default 2s, at most Interval.
	Timeout time.Duration
	// Log gets a line when a dependency goes down (warn) or comes back
	// (info). Default discard.
	Log *slog.Logger
	// Registerer gets coordinator_dependency_up and
	// coordinator_dependency_check_duration_seconds. Nil: not registered.
	Registerer prometheus.Registerer
}

// Result is the latest check of one dependency.
type Result struct {
	Name string `json:"name"`
	// Checked is false until the first check of it ended.
	Checked bool `json:"checked"`
	OK      bool `json:"ok"`
	// Error is the failure as the client library reported it (it may name
	// hosts and ports: it is shown only to authenticated callers).
	Error      string    `json:"error,omitempty"`
	CheckedAt  time.Time `json:"checked_at"`
	DurationMS int64     `json:"duration_ms"`
	// Since is when the dependency entered its current state (up or down).
	Since time.Time `json:"since"`
}

// Monitor runs the checks. Start it once; Stop is safe twice and waits.
type Monitor struct {
	cfg Config
	log *slog.Logger

	up       *prometheus.GaugeVec
	duration *prometheus.HistogramVec

	mu      sync.Mutex
	results []Result
	rounds  int
	changed chan struct{} // closed and replaced after every round

	startOnce, stopOnce sync.Once
	cancel              context.CancelFunc
	done                chan struct{}
}

// New validates cfg and returns a Monitor that has not started.
func New(cfg Config) (*Monitor, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	cfg.Timeout = min(cfg.Timeout, cfg.Interval)
	m := &Monitor{cfg: cfg, log: cfg.Log, changed: make(chan struct{}), done: make(chan struct{})}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	seen := map[string]bool{}
	for _, c := range cfg.Checks {
		if c.Name == "" || c.Check == nil || seen[c.Name] {
			return nil, fmt.Errorf("health: check %q needs a unique name and a func", c.Name)
		}
		seen[c.Name] = true
		m.results = append(m.results, Result{Name: c.Name})
	}
	m.up = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "coordinator_dependency_up",
		Help: "1 when the latest background check of the dependency passed, 0 when it failed.",
	}, []string{"dependency"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "coordinator_dependency_check_duration_seconds",
		Help:    "Duration of the background dependency checks.",
		Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2, 5},
	}, []string{"dependency"})
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{m.up, m.duration} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("health: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

// Start runs the first round before it returns (each check bounded by
// Timeout), so the report is meaningful from the start, and then one every
// Interval in the background, until Stop.
func (m *Monitor) Start(ctx context.Context) error {
	started := false
	m.startOnce.Do(func() {
		started = true
		ctx, m.cancel = context.WithCancel(context.WithoutCancel(ctx))
		m.Round(ctx)
		go m.loop(ctx)
	})
	if !started {
		return errors.New("health: monitor started twice")
	}
	return nil
}

// Stop ends the loop and waits for a round in progress (each check is
// bounded by Timeout). Safe twice, and before Start.
func (m *Monitor) Stop() {
	m.stopOnce.Do(func() {
		m.startOnce.Do(func() { close(m.done) }) // never started: nothing to wait for
		if m.cancel != nil {
			m.cancel()
		}
		<-m.done
	})
}

func (m *Monitor) loop(ctx context.Context) {
	defer close(m.done)
	t := time.NewTimer(m.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.Round(ctx)
		t.Reset(m.cfg.Interval)
	}
}

// Round runs every check once, concurrently, and records the results.
func (m *Monitor) Round(ctx context.Context) {
	out := make([]Result, len(m.cfg.Checks))
	var wg sync.WaitGroup
	for i, c := range m.cfg.Checks {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
			defer cancel()
			start := time.Now()
			err := run(cctx, c)
			took := time.Since(start)
			out[i] = Result{Name: c.Name, Checked: true, OK: err == nil, CheckedAt: start.UTC(), DurationMS: took.Milliseconds()}
			if err != nil {
				out[i].Error = err.Error()
			}
			m.duration.WithLabelValues(c.Name).Observe(took.Seconds())
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // stopping: the checks were cut short, they say nothing
	}
	m.mu.Lock()
	for i, r := range out {
		prev := m.results[i]
		r.Since = prev.Since
		if !prev.Checked || prev.OK != r.OK {
			r.Since = r.CheckedAt
			m.transition(prev, r)
		}
		m.results[i] = r
		up := 0.0
		if r.OK {
			up = 1
		}
		m.up.WithLabelValues(r.Name).Set(up)
	}
	m.rounds++
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()
}

func (m *Monitor) transition(prev, now Result) {
	switch {
	case !now.OK:
		m.log.Warn("dependency_down", "dependency", now.Name, "error", now.Error)
	case prev.Checked:
		m.log.Info("dependency_up", "dependency", now.Name, "down_for", now.CheckedAt.Sub(prev.Since).Round(time.Millisecond))
	}
}

// Snapshot returns the latest result of every check, in Config order.
func (m *Monitor) Snapshot() []Result {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Result(nil), m.results...)
}

// Rounds is the number of completed rounds, and a channel closed when the
// next one completes (tests and start-up wait on it).
func (m *Monitor) Rounds() (int, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.rounds, m.changed
}

// run calls c.Check, turning a panic or an overrun into an error.
func run(ctx context.Context, c Check) error {
	done := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- fmt.Errorf("check panicked: %v", p)
			}
		}()
		done <- c.Check(ctx)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no answer within the check timeout: %w", context.Cause(ctx))
	}
}

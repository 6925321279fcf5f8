package trigger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/telco-platform/coordinator/internal/cronspec"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
)

// CronJob is one schedule on this replica. Every replica runs the same
// schedules; the ownership lock, not the cron, decides who does the work.
type CronJob struct {
	// Name shows in logs and metrics (for example "msisdn-reaper").
	Name string
	// Spec is a robfig/cron spec: optional seconds field, @every, CRON_TZ=.
	Spec string
	// Jitter delays each tick by a random duration in [0, Jitter), so that
	// replicas with aligned clocks do not all hit Redis in the same
	// millisecond. Zero: CronConfig.Jitter.
	Jitter time.Duration
	// Run does one tick's work. The trigger's Source is job.SourceCron; at
	// is the tick's scheduled time (for a regular tick, when cron fired it;
	// for a catch-up, the missed tick's time), before any jitter. It
	// returns nil when the tick is finished with (its run completed, failed
	// for good, or is recorded for the resumer), ErrShuttingDown when the
	// replica no longer takes work, and any other error when the tick is
	// neither done nor durable: the cron runs it again, the same trigger,
	// with backoff, until the schedule's next tick is due
	// (retryTickUntilDurable).
	Run func(ctx context.Context, t job.Trigger, at time.Time) error
	// Key, when set, names the work of the tick at at (its lock key): a
	// tick given up whose next tick has the same key is superseded, not
	// dropped (every reaper sweep is the same work; each month's bill run
	// is not).
	Key func(at time.Time) (string, error)
}

// CronConfig configures Cron.
type CronConfig struct {
	// Replica is this replica's id (the ticks' requested_by).
	Replica string
	// Log defaults to discard.
	Log *slog.Logger
	// Metrics may be nil.
	Metrics *Metrics
	// Jitter is the jitter of every job whose own Jitter is zero. Default 0
	// (off).
	Jitter time.Duration
	// CatchUpWindow: at Start, each job's latest scheduled tick in
	// (start - CatchUpWindow, start] is run once, as a tick this replica
	// may have missed while it was down. It goes through the job's Run
	// like any tick, so the lock and the kind's claim answer when another
	// replica ran it (already_owned, already_completed). @every schedules
	// have no fixed ticks and are not caught up. 0 (default): off.
	CatchUpWindow time.Duration
	// Now is the clock catch-up reads. Default time.Now.
	Now func() time.Time
	// RetryBackoff is the delay before a tick that is neither done nor
	// durable is run again; it doubles per attempt up to RetryMaxBackoff.
	// Defaults DefaultCronRetryBackoff and DefaultCronRetryMaxBackoff.
	RetryBackoff, RetryMaxBackoff time.Duration
}

// Defaults of CronConfig's retry of a tick that is neither done nor durable.
const (
	DefaultCronRetryBackoff    = time.Second
	DefaultCronRetryMaxBackoff = time.Minute
)

// maxCatchUpSteps bounds the walk over a schedule's ticks in the catch-up
// window (a per-second spec over a long window is not caught up).
const maxCatchUpSteps = 1 << 20

// Cron fires CronJobs. A tick that arrives while the previous tick of the same
// job still runs on this replica is skipped (logged), never queued. A tick
// whose work is neither done nor durable (its run failed transiently and
// could not be recorded for the resumer, say with Postgres down) is run
// again with backoff until it is, bounded by the schedule's next tick
// (retryTickUntilDurable). A tick that panics is recovered, logged
// (cron_tick_panicked, with the stack) and counted
// (coordinator_trigger_cron_panics_total); the replica goes on.
type Cron struct {
	cfg  CronConfig
	log  *slog.Logger
	c    *cron.Cron
	jobs []cronEntry

	mu       sync.Mutex
	started  bool
	stopOnce sync.Once
	ctx      context.Context
	cancel   context.CancelFunc
	catchUps sync.WaitGroup
}

type cronEntry struct {
	job      CronJob
	schedule cron.Schedule
	running  *sync.Mutex
}

// NewCron validates every spec up front; an error names the job and the spec.
func NewCron(cfg CronConfig, jobs ...CronJob) (*Cron, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.RetryBackoff <= 0 {
		cfg.RetryBackoff = DefaultCronRetryBackoff
	}
	if cfg.RetryMaxBackoff <= 0 {
		cfg.RetryMaxBackoff = DefaultCronRetryMaxBackoff
	}
	cfg.RetryMaxBackoff = max(cfg.RetryMaxBackoff, cfg.RetryBackoff)
	ctx, cancel := context.WithCancel(context.Background())
	cr := &Cron{cfg: cfg, log: cfg.Log, ctx: ctx, cancel: cancel,
		c: cron.New(cron.WithParser(cronspec.Parser), cron.WithLogger(cron.DiscardLogger))}
	for _, j := range jobs {
		if j.Spec == "" {
			continue
		}
		if j.Run == nil {
			cancel()
			return nil, fmt.Errorf("trigger: cron job %q has no Run", j.Name)
		}
		if j.Jitter <= 0 {
			j.Jitter = cfg.Jitter
		}
		sched, err := cronspec.Parse(j.Spec)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("trigger: cron job %q spec %q: %w", j.Name, j.Spec, err)
		}
		e := cronEntry{job: j, schedule: sched, running: &sync.Mutex{}}
		cfg.Metrics.cronJob(j.Name)
		// Recover is the outermost wrapper: a panicking tick is logged and
		// counted, and its deferred unlock still runs.
		cr.c.Schedule(sched, cron.NewChain(cr.recoverer(j.Name)).Then(cron.FuncJob(func() { cr.tick(e, time.Now(), false) })))
		cr.jobs = append(cr.jobs, e)
		cfg.Log.Info("cron_scheduled", "job", j.Name, "spec", j.Spec, "jitter", j.Jitter, "catchup_window", cfg.CatchUpWindow)
	}
	return cr, nil
}

// recoverer is the chain's Recover: robfig/cron's own logs through its
// Logger interface and counts nothing.
func (cr *Cron) recoverer(name string) cron.JobWrapper {
	return func(j cron.Job) cron.Job {
		return cron.FuncJob(func() {
			defer func() {
				if p := recover(); p != nil {
					cr.cfg.Metrics.cronPanic(name)
					cr.log.Error("cron_tick_panicked", "job", name, "error", fmt.Sprint(p), "stack", string(debug.Stack()))
				}
			}()
			j.Run()
		})
	}
}

// tick runs one tick of e scheduled at at.
func (cr *Cron) tick(e cronEntry, at time.Time, catchUp bool) {
	j := e.job
	if !e.running.TryLock() {
		cr.log.Warn("cron_tick_skipped", "job", j.Name, "reason", "previous tick still running", "scheduled", at)
		return
	}
	defer e.running.Unlock()
	if j.Jitter > 0 {
		t := time.NewTimer(rand.N(j.Jitter))
		select {
		case <-t.C:
		case <-cr.ctx.Done():
			t.Stop()
			return
		}
	}
	if cr.ctx.Err() != nil {
		return
	}
	t := job.Trigger{Source: job.SourceCron, RequestID: events.NewID(), RequestedBy: cr.cfg.Replica}
	if catchUp {
		cr.cfg.Metrics.cronCatchUp(j.Name)
		cr.log.Info("cron_catchup_tick", "job", j.Name, "scheduled", at, "request_id", t.RequestID)
	}
	cr.retryTickUntilDurable(j, e.schedule.Next(at), t, at)
}

// Start begins firing, then runs each job's missed tick (see
// CronConfig.CatchUpWindow) in the background; it returns at once.
func (cr *Cron) Start(context.Context) error {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	if cr.started {
		return errors.New("trigger: cron already started")
	}
	cr.started = true
	// Cron first, then the catch-up's now: a tick between the two is run
	// twice at worst (the lock answers the second), never lost.
	cr.c.Start()
	now := cr.cfg.Now()
	for _, e := range cr.jobs {
		at, ok := lastTick(e.schedule, now, cr.cfg.CatchUpWindow)
		if !ok {
			continue
		}
		cr.catchUps.Add(1)
		go func() {
			defer cr.catchUps.Done()
			cron.NewChain(cr.recoverer(e.job.Name)).Then(cron.FuncJob(func() { cr.tick(e, at, true) })).Run()
		}()
	}
	return nil
}

// lastTick returns sched's latest tick in (now-window, now]. @every
// schedules (robfig's ConstantDelaySchedule, counted from the start) have
// none, and a window whose ticks are too many to walk gives none.
func lastTick(sched cron.Schedule, now time.Time, window time.Duration) (time.Time, bool) {
	if window <= 0 {
		return time.Time{}, false
	}
	if _, every := sched.(cron.ConstantDelaySchedule); every {
		return time.Time{}, false
	}
	var last time.Time
	t := now.Add(-window)
	for range maxCatchUpSteps {
		next := sched.Next(t)
		if next.IsZero() || next.After(now) {
			return last, !last.IsZero()
		}
		last, t = next, next
	}
	return time.Time{}, false
}

// Stop stops firing, cancels the context of running ticks and waits for them
// (catch-ups included). It is safe to call twice.
func (cr *Cron) Stop() {
	cr.stopOnce.Do(func() {
		cr.cancel()
		<-cr.c.Stop().Done()
		cr.catchUps.Wait()
	})
}

// ScheduleLocation is the time zone a cron spec fires in: its CRON_TZ= or
// TZ= prefix, else the process's local zone. A kind's Tick gets the tick's
// time in it (the bill-run schedule bills the month before, there).
func ScheduleLocation(spec string) *time.Location { return cronspec.Location(spec) }

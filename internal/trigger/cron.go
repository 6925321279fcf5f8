package trigger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
)

// CronJob is one schedule on this replica. Every replica runs the same
// schedules; the ownership lock, not the cron, decides who does the work.
type CronJob struct {
	// Name shows in logs (for example "msisdn-reaper").
	Name string
	// Spec is a robfig/cron spec: optional seconds field, @every, CRON_TZ=.
	Spec string
	// Jitter delays each tick by a random duration in [0, Jitter), so that
	// replicas with aligned clocks do not all hit Redis in the same
	// millisecond. Zero disables it.
	Jitter time.Duration
	// Run does one tick's work. The trigger's Source is job.SourceCron.
	Run func(ctx context.Context, t job.Trigger)
}

// Cron fires CronJobs. A tick that arrives while the previous tick of the same
// job still runs on this replica is skipped (logged), never queued.
type Cron struct {
	log     *slog.Logger
	replica string
	c       *cron.Cron

	mu       sync.Mutex
	started  bool
	stopOnce sync.Once
	ctx      context.Context
	cancel   context.CancelFunc
}

// NewCron validates every spec up front; an error names the job and the spec.
func NewCron(replica string, log *slog.Logger, jobs ...CronJob) (*Cron, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cr := &Cron{log: log, replica: replica, ctx: ctx, cancel: cancel,
		c: cron.New(cron.WithParser(config.CronParser), cron.WithLogger(cron.DiscardLogger))}
	for _, j := range jobs {
		if j.Spec == "" {
			continue
		}
		if j.Run == nil {
			cancel()
			return nil, fmt.Errorf("trigger: cron job %q has no Run", j.Name)
		}
		if _, err := cr.c.AddJob(j.Spec, cr.wrap(j)); err != nil {
			cancel()
			return nil, fmt.Errorf("trigger: cron job %q spec %q: %w", j.Name, j.Spec, err)
		}
		log.Info("cron_scheduled", "job", j.Name, "spec", j.Spec, "jitter", j.Jitter)
	}
	return cr, nil
}

func (cr *Cron) wrap(j CronJob) cron.Job {
	var running sync.Mutex
	return cron.FuncJob(func() {
		if !running.TryLock() {
			cr.log.Warn("cron_tick_skipped", "job", j.Name, "reason", "previous tick still running")
			return
		}
		defer running.Unlock()
		if j.Jitter > 0 {
			select {
			case <-time.After(rand.N(j.Jitter)):
			case <-cr.ctx.Done():
				return
			}
		}
		if cr.ctx.Err() != nil {
			return
		}
		j.Run(cr.ctx, job.Trigger{Source: job.SourceCron, RequestID: events.NewID(), RequestedBy: cr.replica})
	})
}

// Start begins firing; it returns at once.
func (cr *Cron) Start(context.Context) error {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	if cr.started {
		return errors.New("trigger: cron already started")
	}
	cr.started = true
	cr.c.Start()
	return nil
}

// Stop stops firing, cancels the context of running ticks and waits for them.
// It is safe to call twice.
func (cr *Cron) Stop() {
	cr.stopOnce.Do(func() {
		cr.cancel()
		<-cr.c.Stop().Done()
	})
}

// ScheduleLocation is the time zone a cron spec fires in: its CRON_TZ= or
// TZ= prefix, else the process's local zone. A kind's Tick gets the tick's
// time in it (the bill-run schedule bills the month before, there).
func ScheduleLocation(spec string) *time.Location {
	for _, p := range []string{"CRON_TZ=", "TZ="} {
		if rest, ok := strings.CutPrefix(spec, p); ok {
			name, _, _ := strings.Cut(rest, " ")
			if loc, err := time.LoadLocation(name); err == nil {
				return loc
			}
		}
	}
	return time.Local
}

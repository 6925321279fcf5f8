package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/eventsink"
	"github.com/telco-platform/coordinator/internal/httpapi"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/migrate"
	"github.com/telco-platform/coordinator/internal/msisdnreaper"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/topics"
	"github.com/telco-platform/coordinator/internal/trigger"
)

func init() {
	register(command{name: "serve", summary: "run a replica: Kafka, cron and HTTP triggers; events to Kafka", run: runServe})
}

// Test hooks, read only here and only by the end-to-end tests (internal/e2e).
// They are not part of DESIGN.md's configuration contract.
const (
	// envTestBatchDelay slows every bill-run batch (a Go duration), so a test
	// can kill the owner mid-run.
	envTestBatchDelay = "COORDINATOR_TEST_BILLRUN_BATCH_DELAY"
	// envTestSessionTimeout shortens the Kafka group session timeout, so a
	// killed replica's partitions move within seconds instead of 45 s.
	envTestSessionTimeout = "COORDINATOR_TEST_KAFKA_SESSION_TIMEOUT"
)

// startupTimeout bounds each start-up step that talks to a dependency.
const startupTimeout = 15 * time.Second

// replica is one running `coordinator serve`: its components in start order.
type replica struct {
	cfg   config.Config
	log   *slog.Logger
	reg   *prometheus.Registry
	names topics.Names

	pool     *pgxpool.Pool
	locker   ownership.Locker
	sink     *eventsink.Kafka
	emit     events.Emitter
	adm      *kadm.Client
	disp     *trigger.Dispatcher
	consumer *trigger.KafkaConsumer
	cron     *trigger.Cron
	api      *httpapi.API
	http     *httpapi.Server
}

func runServe(ctx context.Context, cio cliIO, args []string) int {
	cfg, rest, code := loadConfig(cio, "serve", args)
	if code != 0 {
		return code
	}
	if len(rest) != 0 {
		fmt.Fprintf(cio.stderr, "coordinator serve: unexpected arguments %q\nusage: coordinator serve [flags]\n", rest)
		return job.ExitUsage
	}
	if err := cfg.RequireDatabase(); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator serve: %v\n", err)
		return job.ExitUsage
	}
	hooks, err := readServeHooks(cio.getenv)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator serve: %v\n", err)
		return job.ExitUsage
	}
	log := newLogger(cfg, cio.stderr)
	r := &replica{cfg: cfg, log: log, names: topics.New(cfg.KafkaTopicPrefix)}
	defer r.stop()
	if code := r.start(ctx, hooks); code != 0 {
		return code
	}
	<-ctx.Done()
	log.Info("shutdown_started", "timeout", cfg.ShutdownTimeout)
	start := time.Now()
	r.stop()
	log.Info("shutdown_complete", "took_ms", time.Since(start).Milliseconds())
	return 0
}

type serveHooks struct {
	batchDelay     time.Duration
	sessionTimeout time.Duration
}

func readServeHooks(getenv func(string) string) (serveHooks, error) {
	var h serveHooks
	for _, v := range []struct {
		env string
		dst *time.Duration
	}{{envTestBatchDelay, &h.batchDelay}, {envTestSessionTimeout, &h.sessionTimeout}} {
		raw := getenv(v.env)
		if raw == "" {
			continue
		}
		d, err := time.ParseDuration(raw)
		if err != nil || d < 0 {
			return h, fmt.Errorf("config: %s = %q: not a duration", v.env, raw)
		}
		*v.dst = d
	}
	return h, nil
}

// start brings the components up in dependency order. On failure it logs,
// returns the exit code, and leaves what started to stop.
func (r *replica) start(ctx context.Context, hooks serveHooks) int {
	cfg, log := r.cfg, r.log
	r.reg = prometheus.NewRegistry()
	r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Postgres: batch workers, the planner, reaper workers, status reads.
	stepCtx, cancel := context.WithTimeout(ctx, startupTimeout)
	defer cancel()
	pool, err := postgres.Connect(stepCtx, cfg.DatabaseURL, int32(cfg.BillrunWorkers+8))
	if err != nil {
		log.Error("serve_start_failed", "step", "postgres", "error", err)
		return job.ExitUnavailable
	}
	r.pool = pool
	if pending, err := pendingMigrations(stepCtx, pool); err != nil {
		log.Error("migrations_unknown", "error", err, "detail", "readiness fails until `coordinator migrate up` has run")
	} else if pending > 0 {
		log.Error("migrations_pending", "pending", pending, "detail", "run `coordinator migrate up`; readiness fails until then")
	}

	locker, err := openLocker(stepCtx, cfg, log, r.reg)
	if err != nil {
		log.Error("serve_start_failed", "step", "lock", "error", err)
		return job.ExitUnavailable
	}
	r.locker = locker

	sink, err := eventsink.New(eventsink.Config{
		Brokers: cfg.KafkaBrokers, Topic: r.names.Events, Log: log,
		Metrics:    eventsink.NewMetrics(r.reg),
		ClientOpts: []kgo.Opt{kgo.ClientID("coordinator-events-" + cfg.ReplicaID)},
	})
	if err != nil {
		log.Error("serve_start_failed", "step", "event_sink", "error", err)
		return job.ExitFailed
	}
	if err := sink.Start(ctx); err != nil {
		log.Error("serve_start_failed", "step", "event_sink", "error", err)
		return job.ExitUnavailable
	}
	r.sink = sink
	r.emit = events.Multi{events.NewLogEmitter(log), sink}

	adm, err := topics.Dial(cfg.KafkaBrokers, kgo.ClientID("coordinator-admin-"+cfg.ReplicaID))
	if err != nil {
		log.Error("serve_start_failed", "step", "kafka_admin", "error", err)
		return job.ExitFailed
	}
	r.adm = adm
	if err := topics.Ensure(stepCtx, adm, r.names, cfg.KafkaCreateTopics); err != nil {
		// Not fatal: readiness names the missing topics until they exist.
		log.Error("topics_not_ready", "create", cfg.KafkaCreateTopics, "error", err)
	}

	billMetrics := billrun.NewMetrics(r.reg)
	bcfg := billrun.Config{ReplicaID: cfg.ReplicaID, BatchSize: cfg.BillrunBatchSize, Workers: cfg.BillrunWorkers,
		Logger: log, Metrics: billMetrics}
	if hooks.batchDelay > 0 {
		log.Warn("test_hook_enabled", "hook", envTestBatchDelay, "delay", hooks.batchDelay)
		delay := hooks.batchDelay
		bcfg.BeforeBatch = func(ctx context.Context, _, _ int64) error {
			t := time.NewTimer(delay)
			defer t.Stop()
			select {
			case <-t.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	runner := billrun.New(pool, locker, r.emit, bcfg)
	scfg := msisdnreaper.Config{ReplicaID: cfg.ReplicaID, Lease: cfg.ReaperLease, BatchSize: cfg.ReaperBatchSize,
		MinHold: cfg.ReaperMinHold, Logger: log, Metrics: msisdnreaper.NewMetrics(r.reg)}
	if err := scfg.Validate(); err != nil {
		log.Error("serve_start_failed", "step", "reaper", "error", err)
		return job.ExitUsage
	}
	sweeper := msisdnreaper.NewSweeper(pool, locker, r.emit, scfg)

	tm := trigger.NewMetrics(r.reg)
	r.disp = trigger.NewDispatcher(trigger.DispatcherConfig{BillRuns: runner, Sweeper: sweeper, Log: log, Metrics: tm, Replica: cfg.ReplicaID})

	kcfg := trigger.KafkaConfig{Brokers: cfg.KafkaBrokers, Group: cfg.KafkaGroup, Topics: r.names, Replica: cfg.ReplicaID,
		DrainTimeout: cfg.ShutdownTimeout}
	if hooks.sessionTimeout > 0 {
		log.Warn("test_hook_enabled", "hook", envTestSessionTimeout, "session_timeout", hooks.sessionTimeout)
		kcfg.ClientOpts = append(kcfg.ClientOpts, kgo.SessionTimeout(hooks.sessionTimeout),
			kgo.HeartbeatInterval(hooks.sessionTimeout/6))
	}
	consumer, err := trigger.NewKafkaConsumer(kcfg, r.disp, r.emit, log, tm)
	if err != nil {
		log.Error("serve_start_failed", "step", "kafka_consumer", "error", err)
		return job.ExitFailed
	}
	if err := consumer.Start(ctx); err != nil {
		log.Error("serve_start_failed", "step", "kafka_consumer", "error", err)
		return job.ExitUnavailable
	}
	r.consumer = consumer

	cr, err := trigger.NewCron(cfg.ReplicaID, log, r.cronJobs()...)
	if err != nil {
		log.Error("serve_start_failed", "step", "cron", "error", err)
		return job.ExitUsage
	}
	if err := cr.Start(ctx); err != nil {
		log.Error("serve_start_failed", "step", "cron", "error", err)
		return job.ExitFailed
	}
	r.cron = cr

	var inspector ownership.Inspector
	if in, ok := locker.(ownership.Inspector); ok {
		inspector = in
	}
	api, err := httpapi.New(httpapi.Config{
		Replica: cfg.ReplicaID, Token: cfg.AdminToken, Dispatcher: r.disp,
		Status: func(ctx context.Context, period string) (any, error) {
			p, err := billrun.ParsePeriod(period)
			if err != nil {
				return nil, err
			}
			st, err := runner.Status(ctx, p)
			if errors.Is(err, billrun.ErrNotFound) {
				return nil, httpapi.ErrNotFound
			}
			return st, err
		},
		Locks: inspector, Checks: r.readinessChecks(),
		Metrics: promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg}),
		Log:     log, Registerer: r.reg,
	})
	if err != nil {
		log.Error("serve_start_failed", "step", "http", "error", err)
		return job.ExitFailed
	}
	r.api = api
	srv := httpapi.NewServer(cfg.HTTPAddr, api, log)
	if err := srv.Start(ctx); err != nil {
		log.Error("serve_start_failed", "step", "http", "error", err)
		return job.ExitUnavailable
	}
	r.http = srv

	lockMode := cfg.LockRedisMode
	if !cfg.LockEnabled {
		lockMode = "memory (single replica)"
	}
	log.Info("coordinator_started",
		"version", version,
		"http_addr", srv.Addr().String(),
		"kafka_brokers", strings.Join(cfg.KafkaBrokers, ","),
		"kafka_group", cfg.KafkaGroup,
		"trigger_topics", strings.Join(r.names.Triggers(), ","),
		"events_topic", r.names.Events,
		"lock_mode", lockMode,
		"lock_key_prefix", cfg.LockKeyPrefix,
		"lock_watchdog_timeout", cfg.LockWatchdogTimeout,
		"reaper_schedule", cfg.ReaperSchedule,
		"billrun_schedule", cfg.BillrunSchedule,
		"admin_api", cfg.AdminToken != "",
	)
	return 0
}

// cronJobs are the reaper schedule and the optional bill-run schedule. A
// tick's work runs detached from the cron's own cancellation: shutdown gives
// it the dispatcher's bound (COORDINATOR_SHUTDOWN_TIMEOUT) to finish.
func (r *replica) cronJobs() []trigger.CronJob {
	jobs := []trigger.CronJob{{
		Name: msisdnreaper.JobName, Spec: r.cfg.ReaperSchedule,
		Run: func(ctx context.Context, t job.Trigger) { r.disp.Sweep(context.WithoutCancel(ctx), t) },
	}}
	if spec := r.cfg.BillrunSchedule; spec != "" {
		loc := scheduleLocation(spec)
		jobs = append(jobs, trigger.CronJob{
			Name: billrun.JobName, Spec: spec,
			Run: func(ctx context.Context, t job.Trigger) {
				p := billrun.PeriodOf(time.Now().In(loc)).Previous()
				if _, err := r.disp.BillRun(context.WithoutCancel(ctx), p.String(), t); err != nil {
					r.log.Error("cron_billrun_failed", "period", p.String(), "request_id", t.RequestID, "error", err)
				}
			},
		})
	}
	return jobs
}

// scheduleLocation is the time zone a cron spec fires in: its CRON_TZ= or
// TZ= prefix, else the process's local zone.
func scheduleLocation(spec string) *time.Location {
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

// readinessChecks name each dependency: redis (when the lock is on), postgres
// with its migrations, and kafka with the deployment's topics.
func (r *replica) readinessChecks() []httpapi.Check {
	var checks []httpapi.Check
	if p, ok := r.locker.(interface{ Ping(context.Context) error }); ok && r.cfg.LockEnabled {
		checks = append(checks, httpapi.Check{Name: "redis", Check: p.Ping})
	}
	checks = append(checks,
		httpapi.Check{Name: "postgres", Check: func(ctx context.Context) error {
			if err := r.pool.Ping(ctx); err != nil {
				return err
			}
			n, err := pendingMigrations(ctx, r.pool)
			if err != nil {
				return err
			}
			if n > 0 {
				return fmt.Errorf("%d migrations pending (run `coordinator migrate up`)", n)
			}
			return nil
		}},
		httpapi.Check{Name: "kafka", Check: func(ctx context.Context) error {
			return topics.Check(ctx, r.adm, r.names)
		}},
	)
	return checks
}

func pendingMigrations(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	m, err := migrate.New(pool)
	if err != nil {
		return 0, err
	}
	defer m.Close()
	return m.Pending(ctx)
}

// stop shuts the replica down in reverse start order: stop taking triggers
// (HTTP refuses new work, the consumer and cron stop), let runs in flight
// finish within COORDINATOR_SHUTDOWN_TIMEOUT (then cancel them: bill runs end
// INTERRUPTED and release), stop the HTTP server, flush events, close
// clients. Safe twice.
func (r *replica) stop() {
	if r.pool == nil {
		return // never started, or already stopped
	}
	bound, cancel := context.WithTimeout(context.Background(), r.cfg.ShutdownTimeout)
	defer cancel()
	if r.api != nil {
		r.api.Drain()
	}
	var wg sync.WaitGroup
	if r.cron != nil {
		wg.Go(r.cron.Stop)
	}
	if r.consumer != nil {
		wg.Go(r.consumer.Stop)
	}
	if r.disp != nil {
		r.disp.Shutdown(bound)
	}
	wg.Wait()
	if r.http != nil {
		httpCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := r.http.Stop(httpCtx); err != nil {
			r.log.Warn("http_stop_error", "error", err)
		}
		cancel()
	}
	if r.sink != nil {
		r.sink.Stop()
		if n := r.sink.Dropped(); n > 0 {
			r.log.Warn("events_dropped_at_shutdown", "dropped", n)
		}
	}
	if r.adm != nil {
		r.adm.Close()
	}
	if r.locker != nil {
		if err := r.locker.Close(); err != nil {
			r.log.Warn("lock_close_error", "error", err)
		}
	}
	r.pool.Close()
	*r = replica{cfg: r.cfg, log: r.log}
}

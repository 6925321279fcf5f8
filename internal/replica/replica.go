// Package replica assembles one coordinator replica from the packages that
// do the work: the Postgres pool, the Locker, the Kafka event sink, the
// contract topics, the bill-run Runner and the reaper Sweeper behind one
// trigger Dispatcher, the Kafka trigger consumer, the cron schedules and the
// HTTP admin API. `coordinator serve` runs one; `coordinator demo` runs three
// in one process.
//
// Start brings the components up in dependency order; Stop takes them down
// in reverse: stop taking triggers (HTTP refuses new work, the consumer and
// cron stop), let runs in flight finish within the shutdown timeout (then
// cancel them: bill runs end INTERRUPTED and release), stop the HTTP server,
// flush events, close clients.
package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
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
	"github.com/telco-platform/coordinator/internal/kafkaconn"
	"github.com/telco-platform/coordinator/internal/migrate"
	"github.com/telco-platform/coordinator/internal/msisdnreaper"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/topics"
	"github.com/telco-platform/coordinator/internal/trigger"
)

// StartupTimeout bounds each start-up step that talks to a dependency.
const StartupTimeout = 15 * time.Second

// OpenLocker builds the replica's Locker from the configuration (the CLI's
// openLocker: redislock, or the in-memory Locker when the lock is disabled).
type OpenLocker func(ctx context.Context, cfg config.Config, log *slog.Logger, reg prometheus.Registerer) (ownership.Locker, error)

// Config is what a replica needs besides its configuration.
type Config struct {
	// Config is the replica's configuration (DESIGN.md's variables). Required.
	Config config.Config
	// Log receives every component's log lines. Default: discard.
	Log *slog.Logger
	// OpenLocker builds the Locker. Required.
	OpenLocker OpenLocker
	// Version shows in the start log line. Default "dev".
	Version string
	// BatchDelay slows every bill-run batch (a test hook; 0 = off).
	BatchDelay time.Duration
	// SessionTimeout shortens the Kafka group session timeout (a test hook; 0 = franz-go's default).
	SessionTimeout time.Duration
	// Emit, if set, also receives every event the replica emits (in
	// process), besides the log and the Kafka events topic.
	Emit events.Emitter
}

// StartError says which start-up step failed and the exit code that suits it
// (69 a dependency unreachable, 64 bad configuration, 1 otherwise).
type StartError struct {
	Step string
	Code int
	Err  error
}

func (e *StartError) Error() string { return fmt.Sprintf("replica: start %s: %v", e.Step, e.Err) }
func (e *StartError) Unwrap() error { return e.Err }

// Replica is one running coordinator: its components in start order.
type Replica struct {
	rc    Config
	cfg   config.Config
	log   *slog.Logger
	names topics.Names

	mu      sync.Mutex
	started bool

	reg      *prometheus.Registry
	pool     *pgxpool.Pool
	locker   ownership.Locker
	sink     *eventsink.Kafka
	emit     events.Emitter
	adm      *kadm.Client
	runner   *billrun.Runner
	disp     *trigger.Dispatcher
	consumer *trigger.KafkaConsumer
	cron     *trigger.Cron
	api      *httpapi.API
	http     *httpapi.Server
}

// New returns a replica that has not started.
func New(rc Config) *Replica {
	log := rc.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if rc.Version == "" {
		rc.Version = "dev"
	}
	return &Replica{rc: rc, cfg: rc.Config, log: log, names: topics.New(rc.Config.KafkaTopicPrefix)}
}

// ID is the replica id (COORDINATOR_REPLICA_ID).
func (r *Replica) ID() string { return r.cfg.ReplicaID }

// Topics are the contract topic names of this deployment.
func (r *Replica) Topics() topics.Names { return r.names }

// HTTPAddr is the address the admin API listens on (nil before Start).
func (r *Replica) HTTPAddr() net.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.http == nil {
		return nil
	}
	return r.http.Addr()
}

// Registry is the replica's Prometheus registry, served at /metrics.
func (r *Replica) Registry() *prometheus.Registry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reg
}

// Start brings the components up in dependency order. On failure it returns
// a *StartError; call Stop to release what did start.
func (r *Replica) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return errors.New("replica: started twice")
	}
	r.started = true
	if r.rc.OpenLocker == nil {
		return &StartError{Step: "lock", Code: job.ExitUsage, Err: errors.New("no OpenLocker")}
	}
	cfg, log := r.cfg, r.log
	r.reg = prometheus.NewRegistry()
	r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Postgres: batch workers, the planner, reaper workers, status reads.
	stepCtx, cancel := context.WithTimeout(ctx, StartupTimeout)
	defer cancel()
	pool, err := postgres.Connect(stepCtx, cfg.DatabaseURL, int32(cfg.BillrunWorkers+8))
	if err != nil {
		return &StartError{Step: "postgres", Code: job.ExitUnavailable, Err: err}
	}
	r.pool = pool
	if pending, err := pendingMigrations(stepCtx, pool); err != nil {
		log.Error("migrations_unknown", "error", err, "detail", "readiness fails until `coordinator migrate up` has run")
	} else if pending > 0 {
		log.Error("migrations_pending", "pending", pending, "detail", "run `coordinator migrate up`; readiness fails until then")
	}

	locker, err := r.rc.OpenLocker(stepCtx, cfg, log, r.reg)
	if err != nil {
		return &StartError{Step: "lock", Code: job.ExitUnavailable, Err: err}
	}
	r.locker = locker

	// Every Kafka client of the replica (event sink, topic admin, trigger
	// consumer and its DLQ producer) dials with the same TLS and SASL options.
	kafkaOpts, err := kafkaconn.Options(cfg)
	if err != nil {
		return &StartError{Step: "kafka", Code: job.ExitUsage, Err: err}
	}
	sink, err := eventsink.New(eventsink.Config{
		Brokers: cfg.KafkaBrokers, Topic: r.names.Events, Log: log,
		Metrics:    eventsink.NewMetrics(r.reg),
		ClientOpts: append([]kgo.Opt{kgo.ClientID("coordinator-events-" + cfg.ReplicaID)}, kafkaOpts...),
	})
	if err != nil {
		return &StartError{Step: "event_sink", Code: job.ExitFailed, Err: err}
	}
	if err := sink.Start(ctx); err != nil {
		return &StartError{Step: "event_sink", Code: job.ExitUnavailable, Err: err}
	}
	r.sink = sink
	emit := events.Multi{events.NewLogEmitter(log), sink}
	if r.rc.Emit != nil {
		emit = append(emit, r.rc.Emit)
	}
	r.emit = emit

	adm, err := topics.Dial(cfg.KafkaBrokers, append([]kgo.Opt{kgo.ClientID("coordinator-admin-" + cfg.ReplicaID)}, kafkaOpts...)...)
	if err != nil {
		return &StartError{Step: "kafka_admin", Code: job.ExitFailed, Err: err}
	}
	r.adm = adm
	if err := topics.Ensure(stepCtx, adm, r.names, cfg.KafkaCreateTopics); kafkaconn.Fatal(err) {
		// Rejected credentials or certificates do not heal by retrying.
		return &StartError{Step: "kafka", Code: job.ExitUnavailable, Err: kafkaconn.Classify(err)}
	} else if err != nil {
		// Not fatal: readiness names the missing topics until they exist.
		log.Error("topics_not_ready", "create", cfg.KafkaCreateTopics, "error", err)
	}

	bcfg := billrun.Config{ReplicaID: cfg.ReplicaID, BatchSize: cfg.BillrunBatchSize, Workers: cfg.BillrunWorkers,
		Logger: log, Metrics: billrun.NewMetrics(r.reg)}
	if d := r.rc.BatchDelay; d > 0 {
		bcfg.BeforeBatch = func(ctx context.Context, _, _ int64) error {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	r.runner = billrun.New(pool, locker, r.emit, bcfg)
	scfg := msisdnreaper.Config{ReplicaID: cfg.ReplicaID, Lease: cfg.ReaperLease, BatchSize: cfg.ReaperBatchSize,
		MinHold: cfg.ReaperMinHold, Logger: log, Metrics: msisdnreaper.NewMetrics(r.reg)}
	if err := scfg.Validate(); err != nil {
		return &StartError{Step: "reaper", Code: job.ExitUsage, Err: err}
	}
	sweeper := msisdnreaper.NewSweeper(pool, locker, r.emit, scfg)

	tm := trigger.NewMetrics(r.reg)
	r.disp = trigger.NewDispatcher(trigger.DispatcherConfig{BillRuns: r.runner, Sweeper: sweeper, Log: log, Metrics: tm, Replica: cfg.ReplicaID})

	kcfg := trigger.KafkaConfig{Brokers: cfg.KafkaBrokers, Group: cfg.KafkaGroup, Topics: r.names, Replica: cfg.ReplicaID,
		DrainTimeout: cfg.ShutdownTimeout, ClientOpts: slices.Clip(kafkaOpts)}
	if st := r.rc.SessionTimeout; st > 0 {
		kcfg.ClientOpts = append(kcfg.ClientOpts, kgo.SessionTimeout(st), kgo.HeartbeatInterval(st/6))
	}
	consumer, err := trigger.NewKafkaConsumer(kcfg, r.disp, r.emit, log, tm)
	if err != nil {
		return &StartError{Step: "kafka_consumer", Code: job.ExitFailed, Err: err}
	}
	if err := consumer.Start(ctx); err != nil {
		return &StartError{Step: "kafka_consumer", Code: job.ExitUnavailable, Err: err}
	}
	r.consumer = consumer

	cr, err := trigger.NewCron(cfg.ReplicaID, log, r.cronJobs()...)
	if err != nil {
		return &StartError{Step: "cron", Code: job.ExitUsage, Err: err}
	}
	if err := cr.Start(ctx); err != nil {
		return &StartError{Step: "cron", Code: job.ExitFailed, Err: err}
	}
	r.cron = cr

	var inspector ownership.Inspector
	if in, ok := locker.(ownership.Inspector); ok {
		inspector = in
	}
	runner := r.runner
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
		return &StartError{Step: "http", Code: job.ExitFailed, Err: err}
	}
	r.api = api
	srv := httpapi.NewServer(cfg.HTTPAddr, api, log)
	if err := srv.Start(ctx); err != nil {
		return &StartError{Step: "http", Code: job.ExitUnavailable, Err: err}
	}
	r.http = srv

	lockMode := cfg.LockRedisMode
	if !cfg.LockEnabled {
		lockMode = "memory (single replica)"
	}
	log.Info("coordinator_started",
		"version", r.rc.Version,
		"http_addr", srv.Addr().String(),
		"kafka_brokers", strings.Join(cfg.KafkaBrokers, ","),
		"kafka_transport", kafkaconn.Describe(cfg),
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
	return nil
}

// cronJobs are the reaper schedule and the optional bill-run schedule. A
// tick's work runs detached from the cron's own cancellation: shutdown gives
// it the dispatcher's bound (COORDINATOR_SHUTDOWN_TIMEOUT) to finish.
func (r *Replica) cronJobs() []trigger.CronJob {
	disp, log := r.disp, r.log
	jobs := []trigger.CronJob{{
		Name: msisdnreaper.JobName, Spec: r.cfg.ReaperSchedule,
		Run: func(ctx context.Context, t job.Trigger) { disp.Sweep(context.WithoutCancel(ctx), t) },
	}}
	if spec := r.cfg.BillrunSchedule; spec != "" {
		loc := ScheduleLocation(spec)
		jobs = append(jobs, trigger.CronJob{
			Name: billrun.JobName, Spec: spec,
			Run: func(ctx context.Context, t job.Trigger) {
				p := billrun.PeriodOf(time.Now().In(loc)).Previous()
				if _, err := disp.BillRun(context.WithoutCancel(ctx), p.String(), t); err != nil {
					log.Error("cron_billrun_failed", "period", p.String(), "request_id", t.RequestID, "error", err)
				}
			},
		})
	}
	return jobs
}

// ScheduleLocation is the time zone a cron spec fires in: its CRON_TZ= or
// TZ= prefix, else the process's local zone.
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

// readinessChecks name each dependency: redis (when the lock is on), postgres
// with its migrations, and kafka with the deployment's topics.
func (r *Replica) readinessChecks() []httpapi.Check {
	var checks []httpapi.Check
	if p, ok := r.locker.(interface{ Ping(context.Context) error }); ok && r.cfg.LockEnabled {
		checks = append(checks, httpapi.Check{Name: "redis", Check: p.Ping})
	}
	pool, adm, names := r.pool, r.adm, r.names
	checks = append(checks,
		httpapi.Check{Name: "postgres", Check: func(ctx context.Context) error {
			if err := pool.Ping(ctx); err != nil {
				return err
			}
			n, err := pendingMigrations(ctx, pool)
			if err != nil {
				return err
			}
			if n > 0 {
				return fmt.Errorf("%d migrations pending (run `coordinator migrate up`)", n)
			}
			return nil
		}},
		httpapi.Check{Name: "kafka", Check: func(ctx context.Context) error {
			return topics.Check(ctx, adm, names)
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

// Stop shuts the replica down in reverse start order. Safe twice, and after a
// failed Start.
func (r *Replica) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
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
	r.pool, r.locker, r.sink, r.adm, r.disp, r.consumer, r.cron, r.api, r.http = nil, nil, nil, nil, nil, nil, nil, nil, nil
}

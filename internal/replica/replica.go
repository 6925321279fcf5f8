// Package replica assembles one coordinator replica from the packages that
// do the work, as an ordered list of components (see components): Start
// brings them up in order, Stop takes the started ones down in reverse.
// `coordinator serve` runs one replica; `coordinator-demo` runs three in one
// process.
//
// The order is chosen for shutdown: first the API refuses new work, the
// Kafka consumer stops taking records (and waits for those in flight), the
// dispatcher lets the remaining runs finish within the shutdown timeout
// (then cancels them: they end lost and release), cron stops, the HTTP
// server stops; then events are flushed and clients closed.
package replica

import (
	"cmp"
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
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/eventsink"
	"github.com/telco-platform/coordinator/internal/health"
	"github.com/telco-platform/coordinator/internal/httpapi"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/kafkaconn"
	"github.com/telco-platform/coordinator/internal/kinds"
	"github.com/telco-platform/coordinator/internal/migrate"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/telemetry"
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
	// Config is the replica's configuration. Required.
	Config config.Config
	// Log receives every component's log lines. Default: discard.
	Log *slog.Logger
	// OpenLocker builds the Locker. Required.
	OpenLocker OpenLocker
	// Kinds are the kinds of owned run the replica serves. Default
	// kinds.Registry().
	Kinds *owned.Registry
	// Version shows in the start log line and coordinator_build_info.
	// Default "dev".
	Version string
	// Revision is the VCS revision in coordinator_build_info. Default
	// "unknown".
	Revision string
	// Telemetry traces the replica's runs and clients (Kafka, Redis,
	// Postgres, HTTP). Nil: tracing off. The caller shuts it down after
	// Stop.
	Telemetry *telemetry.Provider
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

// failed marks a component's start error with its exit code.
func failed(code int, err error) error { return &StartError{Code: code, Err: err} }

// component is one part of the replica: started in list order, stopped in
// reverse. stop gets the shutdown's one bound (COORDINATOR_SHUTDOWN_TIMEOUT).
type component struct {
	name  string
	start func(ctx context.Context) error
	stop  func(bound context.Context)
}

// Replica is one running coordinator.
type Replica struct {
	rc    Config
	cfg   config.Config
	log   *slog.Logger
	names topics.Names

	mu      sync.Mutex
	began   bool
	started []component

	// migrationsMsg is non-empty when start-up found migrations pending (or
	// could not tell); readiness fails until a re-check finds them applied.
	migrationsMsg string
	stopWatch     chan struct{}
	watchDone     chan struct{}

	reg      *prometheus.Registry
	pool     *pgxpool.Pool
	locker   ownership.Locker
	sink     *eventsink.Kafka
	emit     events.Emitter
	adm      *kadm.Client
	runner   *owned.Runner
	tm       *trigger.Metrics
	disp     *trigger.Dispatcher
	health   *health.Monitor
	consumer *trigger.KafkaConsumer
	cron     *trigger.Cron
	resumer  *owned.Resumer
	api      *httpapi.API
	http     *httpapi.Server
	con      consoleParts
}

// New returns a replica that has not started. A Kinds registry with a clash
// is reported by Start.
func New(rc Config) *Replica {
	log := rc.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if rc.Version == "" {
		rc.Version = "dev"
	}
	if rc.Revision == "" {
		rc.Revision = "unknown"
	}
	if rc.Telemetry == nil {
		rc.Telemetry = telemetry.Off()
	}
	r := &Replica{rc: rc, cfg: rc.Config, log: log}
	if rc.Kinds != nil {
		r.names = topics.New(rc.Config.KafkaTopicPrefix, rc.Kinds.Topics()...)
	}
	return r
}

// ID is the replica id (COORDINATOR_REPLICA_ID).
func (r *Replica) ID() string { return r.cfg.ReplicaID }

// Topics are the topic names of this deployment (known once Start began).
func (r *Replica) Topics() topics.Names {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.names
}

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

// components are the replica's parts in start order; Stop runs their stops
// in reverse. Each stop waits for what it owns.
func (r *Replica) components() []component {
	return []component{
		{"postgres", r.startPostgres, func(context.Context) { r.pool.Close() }},
		{"lock", r.startLock, func(context.Context) {
			if err := r.locker.Close(); err != nil {
				r.log.Warn("lock_close_error", "error", err)
			}
		}},
		{"event_sink", r.startEvents, func(context.Context) {
			r.sink.Stop()
			if n := r.sink.Dropped(); n > 0 {
				r.log.Warn("events_dropped_at_shutdown", "dropped", n)
			}
		}},
		{"kafka_admin", r.startTopics, func(context.Context) { r.adm.Close() }},
		// Its stop writes the run history buffered (every run has ended).
		{"kinds", r.startRunner, r.stopHistory},
		{"health", r.startHealth, func(context.Context) { r.health.Stop() }},
		// The operator console's tail, events index, heartbeat and janitor
		// (the /ui/ handler is mounted by http).
		{"console", r.startConsole, r.stopConsole},
		{"http", r.startHTTP, func(context.Context) {
			r.closeStreams()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := r.http.Stop(ctx); err != nil {
				r.log.Warn("http_stop_error", "error", err)
			}
		}},
		// Readiness waits for pending migrations: re-checked on the health
		// interval until applied, then never again.
		{"migrations_watch", r.startMigrationsWatch, func(context.Context) {
			close(r.stopWatch)
			<-r.watchDone
		}},
		// Stopped after the dispatcher: a running tick returns when its run
		// did, and the dispatcher's bound ends every run.
		{"cron", r.startCron, func(context.Context) { r.cron.Stop() }},
		// Resumes accepted runs that did not complete (owned.Resumer),
		// through the dispatcher: stopped after it, whose bound has ended
		// a resumed run in flight.
		{"resumer", r.startResumer, func(context.Context) { r.resumer.Stop() }},
		// Started when the runner was (nothing to start); here, its Shutdown
		// lets the runs in flight finish within the bound, then cancels them.
		{"dispatcher", func(context.Context) error { return nil }, func(bound context.Context) { r.disp.Shutdown(bound) }},
		// Stops taking records and waits (up to the shutdown timeout) for
		// those in flight, which it then cancels; nothing unhandled is
		// committed.
		{"kafka_consumer", r.startConsumer, func(context.Context) { r.consumer.Stop() }},
		// The last to start, the first to stop: ready once everything
		// runs; on stop POST /v1/* answers 503 and /readyz fails, while
		// reads, health and metrics go on.
		{"admission", func(context.Context) error {
			r.api.SetReady(httpapi.ConditionStarting)
			return nil
		}, func(context.Context) { r.api.Drain() }},
	}
}

// Start brings the components up in order. On failure it returns a
// *StartError; call Stop to take down what did start.
func (r *Replica) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.began {
		return errors.New("replica: started twice")
	}
	r.began = true
	if r.rc.OpenLocker == nil {
		return &StartError{Step: "lock", Code: job.ExitUsage, Err: errors.New("no OpenLocker")}
	}
	if err := r.cfg.CheckKafkaSession(); err != nil {
		return &StartError{Step: "config", Code: job.ExitUsage, Err: err}
	}
	if r.rc.Kinds == nil {
		reg, err := kinds.Registry()
		if err != nil {
			return &StartError{Step: "kinds", Code: job.ExitFailed, Err: err}
		}
		r.rc.Kinds = reg
		r.names = topics.New(r.cfg.KafkaTopicPrefix, reg.Topics()...)
	}
	r.reg = prometheus.NewRegistry()
	r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		telemetry.BuildInfo(r.rc.Version, r.rc.Revision))
	for _, c := range r.components() {
		if err := c.start(ctx); err != nil {
			se := &StartError{Code: job.ExitFailed, Err: err}
			errors.As(err, &se)
			se.Step = c.name
			return se
		}
		r.started = append(r.started, c)
	}
	r.logStarted()
	return nil
}

// Stop takes the started components down in reverse order under one bound
// (COORDINATOR_SHUTDOWN_TIMEOUT). Safe twice, and after a failed Start.
func (r *Replica) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	bound, cancel := context.WithTimeout(context.Background(), r.cfg.ShutdownTimeout)
	defer cancel()
	for i := len(r.started) - 1; i >= 0; i-- {
		if c := r.started[i]; c.stop != nil {
			c.stop(bound)
		}
	}
	r.started = nil
	r.pool, r.locker, r.sink, r.adm, r.runner, r.disp, r.consumer, r.cron, r.api, r.http, r.health = nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil
	r.resumer = nil
	r.con.api.Store(nil)
	r.con.metrics, r.con.history, r.con.tail, r.con.indexer, r.con.heartbeat, r.con.janitor, r.con.handler = nil, nil, nil, nil, nil, nil, nil
}

// startPostgres opens the pool: batch workers, planners, reaper workers,
// status reads. Migrations are checked here, once (without goose's
// migration lock): pending ones are logged, and readiness fails until they
// are applied (startMigrationsWatch).
func (r *Replica) startPostgres(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, StartupTimeout)
	defer cancel()
	pool, err := postgres.Connect(ctx, r.cfg.DatabaseURL, int32(r.cfg.BillrunWorkers+8),
		postgres.WithTracer(r.rc.Telemetry.PgxTracer()))
	if err != nil {
		return failed(job.ExitUnavailable, err)
	}
	r.pool = pool
	r.reg.MustRegister(telemetry.PgxPoolCollector(pool))
	r.migrationsMsg = checkMigrations(ctx, pool, r.log, true)
	return nil
}

// checkMigrations reads the schema version (no lock): "" when every
// migration is applied, else what readiness shows (a fixed text, no error
// detail). At start-up the finding is logged.
func checkMigrations(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger, atStart bool) string {
	pending, err := pendingMigrations(ctx, pool)
	switch {
	case err != nil:
		if atStart {
			log.Error("migrations_unknown", "error", err, "detail", "readiness fails until the schema version reads as current")
		}
		return "the schema version could not be read"
	case pending > 0:
		if atStart {
			log.Error("migrations_pending", "pending", pending, "detail", "run `coordinator migrate up`; readiness fails until then")
		}
		return fmt.Sprintf("%d migrations pending: run `coordinator migrate up`", pending)
	}
	return ""
}

// startMigrationsWatch holds readiness back while migrations were pending
// at start, re-checking on the health interval until they are applied.
func (r *Replica) startMigrationsWatch(ctx context.Context) error {
	r.stopWatch, r.watchDone = make(chan struct{}), make(chan struct{})
	if r.migrationsMsg == "" {
		close(r.watchDone)
		return nil
	}
	api, pool, log, stop, done := r.api, r.pool, r.log, r.stopWatch, r.watchDone
	api.SetNotReady(httpapi.ConditionMigrations, r.migrationsMsg)
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer close(done)
		defer cancel()
		t := time.NewTicker(cmp.Or(r.cfg.HealthCheckInterval, health.DefaultInterval))
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			cctx, ccancel := context.WithTimeout(ctx, health.DefaultTimeout)
			msg := checkMigrations(cctx, pool, log, false)
			ccancel()
			if msg == "" {
				api.SetReady(httpapi.ConditionMigrations)
				log.Info("migrations_applied", "detail", "the schema is current; readiness no longer waits for it")
				return
			}
			api.SetNotReady(httpapi.ConditionMigrations, msg)
		}
	}()
	return nil
}

func (r *Replica) startLock(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, StartupTimeout)
	defer cancel()
	locker, err := r.rc.OpenLocker(ctx, r.cfg, r.log, r.reg)
	var cfgErr *config.Error
	switch {
	case errors.As(err, &cfgErr): // a Redis that may evict lock keys: no retry fixes it
		return failed(job.ExitUsage, err)
	case err != nil:
		return failed(job.ExitUnavailable, err)
	}
	r.locker = locker
	return InstrumentLocker(locker, r.rc.Telemetry, r.reg)
}

// startEvents starts the Kafka event sink; every event also goes to the log
// (and to Config.Emit).
func (r *Replica) startEvents(ctx context.Context) error {
	opts, err := r.kafkaOpts(kgo.ClientID("coordinator-events-" + r.cfg.ReplicaID))
	if err != nil {
		return err
	}
	sink, err := eventsink.New(eventsink.Config{
		Brokers: r.cfg.KafkaBrokers, Topic: r.names.Events, Log: r.log,
		Metrics:    eventsink.NewMetrics(r.reg),
		ClientOpts: append(opts, r.rc.Telemetry.Kafka("").Opts()...),
	})
	if err != nil {
		return err
	}
	if err := sink.Start(ctx); err != nil {
		return failed(job.ExitUnavailable, err)
	}
	r.sink = sink
	emit := events.Multi{events.NewLogEmitter(r.log), sink}
	if r.rc.Emit != nil {
		emit = append(emit, r.rc.Emit)
	}
	r.emit = emit
	return nil
}

// kafkaOpts are opts plus the configured TLS and SASL options and the
// replica's logger (internal/kafkaconn): every Kafka client of the replica
// (event sink, topic admin, trigger consumer and its DLQ producer) dials
// with them and logs franz-go's lines there.
func (r *Replica) kafkaOpts(opts ...kgo.Opt) ([]kgo.Opt, error) {
	sec, err := kafkaconn.Options(r.cfg, r.log)
	if err != nil {
		return nil, failed(job.ExitUsage, err)
	}
	opts = append(slices.Clip(opts), sec...)
	return append(opts, telemetry.KafkaMetrics(r.reg)...), nil
}

// startTopics creates the deployment's topics when allowed. Missing topics
// are not fatal: readiness names them until they exist. Rejected Kafka
// credentials or certificates are (69): retrying does not mend them.
func (r *Replica) startTopics(ctx context.Context) error {
	opts, err := r.kafkaOpts(kgo.ClientID("coordinator-admin-" + r.cfg.ReplicaID))
	if err != nil {
		return err
	}
	adm, err := topics.Dial(r.cfg.KafkaBrokers, opts...)
	if err != nil {
		return err
	}
	r.adm = adm
	ctx, cancel := context.WithTimeout(ctx, StartupTimeout)
	defer cancel()
	if err := topics.Ensure(ctx, adm, r.names, r.cfg.KafkaCreateTopics); kafkaconn.Fatal(err) {
		return failed(job.ExitUnavailable, kafkaconn.Classify(err))
	} else if err != nil {
		r.log.Error("topics_not_ready", "create", r.cfg.KafkaCreateTopics, "error", err)
	}
	return nil
}

// startRunner opens every kind behind the owned-run template and the
// dispatcher. A kind's bad configuration is exit 64.
func (r *Replica) startRunner(context.Context) error {
	runner, err := owned.NewRunner(r.rc.Kinds, owned.Deps{Config: r.cfg, DB: r.pool, Locker: r.locker, Log: r.log,
		Registerer: r.reg, Telemetry: r.rc.Telemetry, History: r.runHistory()}, r.emit)
	if err != nil {
		return failed(job.ExitUsage, err)
	}
	r.runner, r.tm = runner, trigger.NewMetrics(r.reg)
	r.disp = trigger.NewDispatcher(trigger.DispatcherConfig{Runner: runner, Log: r.log, Metrics: r.tm,
		MaxRunsInFlight: r.cfg.MaxRunsInFlight})
	return nil
}

// startHealth checks the dependencies in the background (GET /v1/health,
// coordinator_dependency_up). Nothing of it gates readiness.
func (r *Replica) startHealth(ctx context.Context) error {
	m, err := health.New(health.Config{Checks: r.dependencyChecks(), Interval: r.cfg.HealthCheckInterval,
		Log: r.log, Registerer: r.reg})
	if err != nil {
		return err
	}
	if err := m.Start(ctx); err != nil {
		return err
	}
	r.health = m
	return nil
}

func (r *Replica) startHTTP(ctx context.Context) error {
	var inspector ownership.Inspector
	if in, ok := r.locker.(ownership.Inspector); ok {
		inspector = in
	}
	acfg := httpapi.Config{
		Replica: r.cfg.ReplicaID, Tokens: r.cfg.AdminTokenSet(), Kinds: r.rc.Kinds, Dispatcher: r.disp,
		Locks: inspector, Health: r.health,
		Metrics: promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg}),
		Log:     r.log, Registerer: r.reg,
	}
	if r.con.handler != nil {
		acfg.Console = r.con.handler
	}
	api, err := httpapi.New(acfg)
	if err != nil {
		return err
	}
	// Not ready until the last component (admission) started.
	api.SetNotReady(httpapi.ConditionStarting, "the replica is starting")
	r.api = api
	r.con.api.Store(api)
	srv := httpapi.NewServer(r.cfg.HTTPAddr, r.rc.Telemetry.HTTPHandler(api), r.log)
	if err := srv.Start(ctx); err != nil {
		return failed(job.ExitUnavailable, err)
	}
	r.http = srv
	return nil
}

func (r *Replica) startCron(ctx context.Context) error {
	cr, err := trigger.NewCron(trigger.CronConfig{Replica: r.cfg.ReplicaID, Log: r.log, Metrics: r.tm,
		Jitter: r.cfg.CronJitter, CatchUpWindow: r.cfg.CronCatchUpWindow}, r.disp.CronJobs()...)
	if err != nil {
		return failed(job.ExitUsage, err)
	}
	if err := cr.Start(ctx); err != nil {
		return err
	}
	r.cron = cr
	return nil
}

// startResumer starts the resumer of the kinds whose Worker is an
// owned.Resumable; its runs go through the dispatcher.
func (r *Replica) startResumer(ctx context.Context) error {
	var inspector ownership.Inspector
	if in, ok := r.locker.(ownership.Inspector); ok {
		inspector = in
	}
	disp := r.disp
	res, err := owned.NewResumer(owned.ResumerConfig{Runner: r.runner, Interval: r.cfg.ResumeInterval,
		MaxAttempts: r.cfg.ResumeMaxAttempts, RepublishAfter: r.cfg.EventsRepublishAfter, Locks: inspector, Log: r.log, Registerer: r.reg,
		Run: func(ctx context.Context, k owned.Kind, p owned.Params, t job.Trigger) job.Result {
			res, _ := disp.Run(ctx, k, p, t)
			return res
		}})
	if err != nil {
		return failed(job.ExitUsage, err)
	}
	if err := res.Start(ctx); err != nil {
		return err
	}
	r.resumer = res
	return nil
}

// sessionOpts are the trigger consumer's group session timeout
// (COORDINATOR_KAFKA_SESSION_TIMEOUT) and a heartbeat well inside it.
func sessionOpts(session time.Duration) []kgo.Opt {
	if session <= 0 {
		return nil
	}
	return []kgo.Opt{kgo.SessionTimeout(session), kgo.HeartbeatInterval(min(3*time.Second, session/6))}
}

func (r *Replica) startConsumer(ctx context.Context) error {
	opts, err := r.kafkaOpts(sessionOpts(r.cfg.KafkaSessionTimeout)...)
	if err != nil {
		return err
	}
	kcfg := trigger.KafkaConfig{Brokers: r.cfg.KafkaBrokers, Group: r.cfg.KafkaGroup, Kinds: r.rc.Kinds, Topics: r.names,
		Replica: r.cfg.ReplicaID, DrainTimeout: r.cfg.ShutdownTimeout, MaxDecompressBatchBytes: r.cfg.KafkaMaxDecompressedBatchBytes, ClientOpts: opts, Tracing: r.rc.Telemetry.Kafka(r.cfg.KafkaGroup)}
	consumer, err := trigger.NewKafkaConsumer(kcfg, r.disp, r.emit, r.log, r.tm)
	if err != nil {
		return err
	}
	if err := consumer.Start(ctx); err != nil {
		return failed(job.ExitUnavailable, err)
	}
	r.consumer = consumer
	return nil
}

func (r *Replica) logStarted() {
	cfg := r.cfg
	lockMode := cfg.LockRedisMode
	if !cfg.LockEnabled {
		lockMode = "memory (single replica)"
	}
	var schedules []string
	for _, j := range r.disp.CronJobs() {
		schedules = append(schedules, j.Name+"="+j.Spec)
	}
	r.log.Info("coordinator_started",
		"version", r.rc.Version,
		"http_addr", r.http.Addr().String(),
		"kafka_brokers", strings.Join(cfg.KafkaBrokers, ","),
		"kafka_transport", kafkaconn.Describe(cfg),
		"kafka_group", cfg.KafkaGroup,
		"kinds", strings.Join(r.rc.Kinds.Commands(), ","),
		"trigger_topics", strings.Join(r.names.Triggers(), ","),
		"events_topic", r.names.Events,
		"lock_mode", lockMode,
		"lock_key_prefix", cfg.LockKeyPrefix,
		"lock_layout", cfg.LockLayout,
		"lock_watchdog_timeout", cfg.LockWatchdogTimeout,
		"schedules", strings.Join(schedules, "; "),
		"admin_api", len(cfg.AdminTokenSet()) > 0,
		"admin_tokens", strings.Join(tokenNames(cfg), ","),
		"max_runs_in_flight", cfg.MaxRunsInFlight,
		"tracing", r.rc.Telemetry.Exporter(),
		"progress_interval", cfg.ProgressInterval,
		"resume_interval", cfg.ResumeInterval,
		"events_republish_after", cfg.EventsRepublishAfter,
		"kafka_session_timeout", cfg.KafkaSessionTimeout,
	)
}

// tokenNames are the admin tokens' names and scopes (never the tokens).
func tokenNames(cfg config.Config) []string {
	var out []string
	for _, t := range cfg.AdminTokenSet() {
		out = append(out, t.String())
	}
	return out
}

// dependencyChecks name each dependency: redis (when the lock is on),
// postgres, and kafka with the deployment's topics.
func (r *Replica) dependencyChecks() []health.Check {
	var checks []health.Check
	if p, ok := r.locker.(interface{ Ping(context.Context) error }); ok && r.cfg.LockEnabled {
		checks = append(checks, health.Check{Name: "redis", Check: p.Ping})
	}
	pool, adm, names := r.pool, r.adm, r.names
	return append(checks,
		health.Check{Name: "postgres", Check: pool.Ping},
		health.Check{Name: "kafka", Check: func(ctx context.Context) error {
			return topics.Check(ctx, adm, names)
		}},
	)
}

func pendingMigrations(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	m, err := migrate.New(pool)
	if err != nil {
		return 0, err
	}
	defer m.Close()
	return m.Pending(ctx)
}

// InstrumentLocker traces the Redis commands of a Locker that has a Redis
// client (redisotel, when tracing is on) and exports its pool's stats on
// reg (coordinator_redis_pool_*, when reg is not nil).
func InstrumentLocker(l ownership.Locker, tel *telemetry.Provider, reg prometheus.Registerer) error {
	rc, ok := l.(interface{ RedisClient() redis.UniversalClient })
	if !ok {
		return nil
	}
	if err := tel.InstrumentRedis(rc.RedisClient()); err != nil {
		return err
	}
	if reg != nil {
		return reg.Register(telemetry.RedisPoolCollector(rc.RedisClient()))
	}
	return nil
}

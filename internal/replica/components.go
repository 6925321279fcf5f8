package replica

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/eventsink"
	"github.com/telco-platform/coordinator/internal/health"
	"github.com/telco-platform/coordinator/internal/httpapi"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/kafkaconn"
	"github.com/telco-platform/coordinator/internal/migrate"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/telemetry"
	"github.com/telco-platform/coordinator/internal/topics"
	"github.com/telco-platform/coordinator/internal/trigger"
)

// The components' starts (the list and their order: components in
// replica.go), and what the replica tells at start.

// startPostgres opens the pool: batch workers, planners, reaper workers,
// status reads. Migrations are checked here, once (without goose's
// migration lock): pending ones are logged, and readiness fails until they
// are applied (startMigrationsWatch).
func (r *Replica) startPostgres(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, StartupTimeout)
	defer cancel()
	pool, err := postgres.Connect(ctx, r.cfg.DatabaseURL, int32(r.cfg.Billrun.Workers+8),
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
		Brokers: r.cfg.Kafka.Brokers, Topic: r.names.Events, Log: r.log,
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
	sec, err := kafkaconn.Options(KafkaConn(r.cfg), r.log)
	if err != nil {
		return nil, failed(job.ExitUsage, err)
	}
	opts = append(slices.Clip(opts), sec...)
	return append(opts, telemetry.KafkaMetrics(r.reg)...), nil
}

// KafkaConn maps the process's COORDINATOR_KAFKA_* transport settings onto
// kafkaconn's: every Kafka client of the replica and of the CLI dials with
// them.
func KafkaConn(cfg config.Config) kafkaconn.Config {
	return kafkaconn.Config{TLS: cfg.Kafka.TLSEnabled(), TLSFiles: cfg.Kafka.TLSFiles(),
		SASLMechanism: cfg.Kafka.SASLMechanism, SASLUsername: cfg.Kafka.SASLUsername, SASLPassword: cfg.Kafka.SASLPassword}
}

// startTopics creates the deployment's topics when allowed. Missing topics
// are not fatal: readiness names them until they exist. Rejected Kafka
// credentials or certificates are (69): retrying does not mend them.
func (r *Replica) startTopics(ctx context.Context) error {
	opts, err := r.kafkaOpts(kgo.ClientID("coordinator-admin-" + r.cfg.ReplicaID))
	if err != nil {
		return err
	}
	adm, err := topics.Dial(r.cfg.Kafka.Brokers, opts...)
	if err != nil {
		return err
	}
	r.adm = adm
	ctx, cancel := context.WithTimeout(ctx, StartupTimeout)
	defer cancel()
	if err := topics.Ensure(ctx, adm, r.names, r.cfg.Kafka.CreateTopics); kafkaconn.Fatal(err) {
		return failed(job.ExitUnavailable, kafkaconn.Classify(err))
	} else if err != nil {
		r.log.Error("topics_not_ready", "create", r.cfg.Kafka.CreateTopics, "error", err)
	}
	return nil
}

// startRunner opens every kind behind the owned-run template and the
// dispatcher. A kind's bad configuration is exit 64.
func (r *Replica) startRunner(context.Context) error {
	runner, err := owned.NewRunner(r.rc.Kinds, owned.RunnerConfig{
		Deps:    owned.Deps{DB: r.pool, Locker: r.locker, Log: r.log, Registerer: r.reg},
		Replica: r.cfg.ReplicaID, Emit: r.emit, Tracer: r.rc.Telemetry.TracerIfOn(owned.TracerName),
		ProgressInterval: r.cfg.ProgressInterval, History: r.runHistory(),
	})
	if err != nil {
		return failed(job.ExitUsage, err)
	}
	r.runner, r.tm = runner, trigger.NewMetrics(r.reg)
	r.disp = trigger.NewDispatcher(trigger.DispatcherConfig{Runner: runner, Log: r.log, Metrics: r.tm,
		MaxRunsInFlight: r.cfg.HTTP.MaxRunsInFlight})
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
		Replica: r.cfg.ReplicaID, Tokens: r.cfg.HTTP.AdminTokenSet(), Kinds: r.rc.Kinds, Dispatcher: r.disp,
		Locks: inspector, Health: r.health,
		Metrics: promhttp.HandlerFor(telemetry.Gatherer(r.reg), promhttp.HandlerOpts{Registry: r.reg}),
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
	srv := httpapi.NewServer(r.cfg.HTTP.Addr, r.rc.Telemetry.HTTPHandler(api), r.log)
	if err := srv.Start(ctx); err != nil {
		return failed(job.ExitUnavailable, err)
	}
	r.http = srv
	return nil
}

func (r *Replica) startCron(ctx context.Context) error {
	cr, err := trigger.NewCron(trigger.CronConfig{Replica: r.cfg.ReplicaID, Log: r.log, Metrics: r.tm,
		Jitter: r.cfg.Cron.Jitter, CatchUpWindow: r.cfg.Cron.CatchUpWindow}, r.disp.CronJobs()...)
	if err != nil {
		return failed(job.ExitUsage, err)
	}
	if err := cr.Start(ctx); err != nil {
		return err
	}
	r.cron = cr
	return nil
}

// startResumer starts the resumer of the kinds whose Worker has
// Incomplete (owned.Worker); its runs go through the dispatcher.
func (r *Replica) startResumer(ctx context.Context) error {
	var inspector ownership.Inspector
	if in, ok := r.locker.(ownership.Inspector); ok {
		inspector = in
	}
	disp := r.disp
	res, err := owned.NewResumer(owned.ResumerConfig{Runner: r.runner, Interval: r.cfg.Resume.Interval,
		MaxAttempts: r.cfg.Resume.MaxAttempts, RepublishAfter: r.cfg.Resume.RepublishAfter, Locks: inspector, Log: r.log, Registerer: r.reg,
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
	opts, err := r.kafkaOpts(sessionOpts(r.cfg.Kafka.SessionTimeout)...)
	if err != nil {
		return err
	}
	kcfg := trigger.KafkaConfig{Brokers: r.cfg.Kafka.Brokers, Group: r.cfg.Kafka.Group, Kinds: r.rc.Kinds, Topics: r.names,
		Replica: r.cfg.ReplicaID, DrainTimeout: r.cfg.ShutdownTimeout, LeaveTimeout: min(5*time.Second, r.cfg.ShutdownTimeout/4), MaxDecompressBatchBytes: r.cfg.Kafka.MaxDecompressedBatchBytes, ClientOpts: opts, Tracing: r.rc.Telemetry.Kafka(r.cfg.Kafka.Group)}
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
	lockMode := cfg.Lock.RedisMode
	if !cfg.Lock.Enabled {
		lockMode = "memory (single replica)"
	}
	var schedules []string
	for _, j := range r.disp.CronJobs() {
		schedules = append(schedules, j.Name+"="+j.Spec)
	}
	r.log.Info("coordinator_started",
		"version", r.rc.Version,
		"http_addr", r.http.Addr().String(),
		"kafka_brokers", strings.Join(cfg.Kafka.Brokers, ","),
		"kafka_transport", kafkaconn.Describe(KafkaConn(cfg)),
		"kafka_group", cfg.Kafka.Group,
		"kinds", strings.Join(r.rc.Kinds.Commands(), ","),
		"trigger_topics", strings.Join(r.names.Triggers(), ","),
		"events_topic", r.names.Events,
		"lock_mode", lockMode,
		"lock_key_prefix", cfg.Lock.KeyPrefix,
		"lock_layout", cfg.Lock.Layout,
		"lock_watchdog_timeout", cfg.Lock.WatchdogTimeout,
		"schedules", strings.Join(schedules, "; "),
		"admin_api", len(cfg.HTTP.AdminTokenSet()) > 0,
		"admin_tokens", strings.Join(tokenNames(cfg), ","),
		"max_runs_in_flight", cfg.HTTP.MaxRunsInFlight,
		"tracing", r.rc.Telemetry.Exporter(),
		"progress_interval", cfg.ProgressInterval,
		"resume_interval", cfg.Resume.Interval,
		"events_republish_after", cfg.Resume.RepublishAfter,
		"kafka_session_timeout", cfg.Kafka.SessionTimeout,
	)
}

// tokenNames are the admin tokens' names and scopes (never the tokens).
func tokenNames(cfg config.Config) []string {
	var out []string
	for _, t := range cfg.HTTP.AdminTokenSet() {
		out = append(out, t.String())
	}
	return out
}

// dependencyChecks name each dependency: redis (when the lock is on),
// postgres, and kafka with the deployment's topics.
func (r *Replica) dependencyChecks() []health.Check {
	var checks []health.Check
	if p, ok := r.locker.(interface{ Ping(context.Context) error }); ok && r.cfg.Lock.Enabled {
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

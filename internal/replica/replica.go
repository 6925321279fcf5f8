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
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/eventsink"
	"github.com/telco-platform/coordinator/internal/health"
	"github.com/telco-platform/coordinator/internal/httpapi"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/kinds"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
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
	// kinds.Registry(Config).
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
		r.names = topics.New(rc.Config.Kafka.TopicPrefix, rc.Kinds.Topics()...)
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
		// Its stop releases the locks kept for a minimum hold (their timers
		// end with the process) and writes the run history buffered (every
		// run has ended).
		{"kinds", r.startRunner, func(ctx context.Context) { r.runner.Close(); r.stopHistory(ctx) }},
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
		reg, err := kinds.Registry(r.cfg)
		if err != nil {
			return &StartError{Step: "kinds", Code: job.ExitFailed, Err: err}
		}
		r.rc.Kinds = reg
		r.names = topics.New(r.cfg.Kafka.TopicPrefix, reg.Topics()...)
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

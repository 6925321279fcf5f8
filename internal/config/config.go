// Package config is the coordinator process's one typed configuration:
// every variable of docs/configuration.md, each also a --flag, described
// once in a table of settings (settings.go and the group files: lock.go,
// kafka.go, http.go, runs.go) that parsing (parse.go), -h and the
// documentation read, and checked (validate.go) with errors that name the
// variable and the value.
//
// It is read at the edge: only cmd/, internal/replica, internal/kinds and
// the demo import it (.golangci.yml), and they map it onto the small Config
// of each component and kind. It imports no adapter.
package config

import (
	"errors"
	"fmt"
	"time"
)

// Config is read once in main and mapped onto each component's own.
type Config struct {
	// DatabaseURL is the Postgres DSN. COORDINATOR_DATABASE_URL, else the
	// content of COORDINATOR_DATABASE_URL_FILE, else DATABASE_URL.
	DatabaseURL string
	// ReplicaID is the owner id in events and locks. Default hostname-pid.
	ReplicaID string
	// HealthCheckInterval is how often the dependencies (Redis, Postgres,
	// Kafka) are checked in the background for /v1/health and
	// coordinator_dependency_up. Default 10s.
	HealthCheckInterval time.Duration
	// ProgressInterval is how often a run in flight logs its progress
	// (<job>_progress records). Default 10s, at least 100ms.
	ProgressInterval time.Duration
	// ShutdownTimeout bounds graceful shutdown. Default 30s.
	ShutdownTimeout time.Duration

	// Lock is the ownership lock's backend (COORDINATOR_LOCK_*).
	Lock Lock
	// Kafka is the brokers, the trigger consumer and the clients' transport
	// (COORDINATOR_KAFKA_*).
	Kafka Kafka
	// HTTP is the admin, health and metrics listener and its tokens.
	HTTP HTTP
	// Reaper is the MSISDN reaper's sweep (COORDINATOR_REAPER_*).
	Reaper Reaper
	// Billrun is the bill-run kind (COORDINATOR_BILLRUN_*,
	// COORDINATOR_BILLING_TZ).
	Billrun Billrun
	// Cron is how every schedule ticks (COORDINATOR_CRON_*).
	Cron Cron
	// Resume is the resumer of runs that did not complete.
	Resume Resume
	// Console is the operator console under /ui/ (COORDINATOR_CONSOLE_*).
	Console Console
	// Log is the process's log output.
	Log Log
}

// Log is the process's log output.
type Log struct {
	// Level is debug, info, warn or error. Default info.
	Level string
	// Format is text or json. Default text.
	Format string
}

// processSettings are the settings of the process as a whole.
func processSettings() []setting {
	return []setting{
		text("COORDINATOR_DATABASE_URL", "database-url", "dsn", "Postgres DSN", "",
			func(c *Config) *string { return &c.DatabaseURL }, checkPostgresURL).
			in(sectionContract, "Postgres DSN (`postgres://` URL or `key=value`); required by commands that touch Postgres. Production: `sslmode=verify-full&sslrootcert=CA_FILE` ([PostgreSQL](#postgresql))").
			secretIn(secretURL, "COORDINATOR_DATABASE_URL_FILE").withFallback("DATABASE_URL"),
		text("COORDINATOR_REPLICA_ID", "replica-id", "id", "owner id shown in events and locks (default hostname-pid)", "",
			func(c *Config) *string { return &c.ReplicaID }, checkReplicaID).
			in(sectionContract, "owner id shown in events and locks (≤128 chars, no whitespace)").documented("hostname-pid"),
		dur("COORDINATOR_HEALTH_CHECK_INTERVAL", "health-check-interval", "how often the dependencies are checked in the background (/v1/health)", "10s",
			100*time.Millisecond, 0, func(c *Config) *time.Duration { return &c.HealthCheckInterval }).
			in(sectionFurther, "how often Redis, PostgreSQL and Kafka are checked in the background (`GET /v1/health`, `coordinator_dependency_up`), and how often a replica that started with migrations pending re-checks them (min 100ms)"),
		dur("COORDINATOR_PROGRESS_INTERVAL", "progress-interval", "how often a run in flight logs its progress (<job>_progress)", "10s",
			100*time.Millisecond, 0, func(c *Config) *time.Duration { return &c.ProgressInterval }).
			in(sectionFurther, "how often a run in flight logs its progress (`billrun_progress`, `msisdn_reaper_progress`, ...; at least 100ms); on a terminal `coordinator run` draws a bar instead ([observability.md](observability.md#progress-of-a-run))"),
		dur("COORDINATOR_SHUTDOWN_TIMEOUT", "shutdown-timeout", "bound on graceful shutdown", "30s",
			time.Second, 0, func(c *Config) *time.Duration { return &c.ShutdownTimeout }).
			in(sectionFurther, "bound on graceful shutdown: in-flight batches finish within it, then runs are interrupted and release"),
	}
}

// logSettings are the log output's.
func logSettings() []setting {
	return []setting{
		enum("COORDINATOR_LOG_LEVEL", "log-level", "log level", "info", func(c *Config) *string { return &c.Log.Level },
			"debug", "info", "warn", "error").in(sectionFurther, "`debug`, `info`, `warn`, `error`"),
		enum("COORDINATOR_LOG_FORMAT", "log-format", "log format", "text", func(c *Config) *string { return &c.Log.Format },
			"text", "json").in(sectionFurther, "`text` or `json`"),
	}
}

// withFallback reads variable when s's own is unset, before its default.
func (s setting) withFallback(variable string) setting {
	s.fallback = variable
	return s
}

// RequireDatabase returns an error naming the variable when no DSN is set.
func (c Config) RequireDatabase() error {
	if c.DatabaseURL == "" {
		return &Error{Variable: "COORDINATOR_DATABASE_URL", Flag: "database-url", Value: "",
			Err: errors.New("required (or DATABASE_URL)")}
	}
	return nil
}

// Error names the variable (and flag) and the offending value.
type Error struct {
	Variable string
	Flag     string
	Value    string
	Err      error
}

func (e *Error) Error() string {
	return fmt.Sprintf("config: %s (--%s) = %q: %v", e.Variable, e.Flag, e.Value, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

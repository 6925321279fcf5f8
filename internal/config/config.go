// Package config is the coordinator's one typed configuration: every
// variable of docs/contract.md's configuration (docs/configuration.md), each also a --flag, with defaults filled in
// one place and a Validate whose error names the variable and the value.
package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/telco-platform/coordinator/internal/adminauth"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/redact"
	"github.com/telco-platform/coordinator/internal/tlsfiles"
)

// Config is read once in main and handed to each component.
type Config struct {
	// DatabaseURL is the Postgres DSN. COORDINATOR_DATABASE_URL, else the
	// content of COORDINATOR_DATABASE_URL_FILE, else DATABASE_URL.
	DatabaseURL string

	// LockEnabled false runs single-replica mode with the in-memory locker. Default true.
	LockEnabled bool
	// LockRedisURL is redis:// or rediss:// in go-redis' own formats
	// (redis.ParseURL, ParseFailoverURL, ParseClusterURL by LockRedisMode).
	// Default REDIS_URL, else redis://127.0.0.1:6379/0.
	LockRedisURL string
	// LockRedisPassword, from COORDINATOR_LOCK_REDIS_PASSWORD_FILE, is the
	// Redis data nodes' password when the URL carries none. Default empty.
	LockRedisPassword string
	// LockRedisTLSCAFile, LockRedisTLSCertFile and LockRedisTLSKeyFile are
	// PEM files for rediss://: the CA bundle that verifies the server
	// (default: the system roots) and a client certificate and key.
	LockRedisTLSCAFile, LockRedisTLSCertFile, LockRedisTLSKeyFile string
	// LockRedisMode is single, sentinel or cluster. Default single.
	LockRedisMode string
	// LockKeyPrefix prefixes every Redis key. Default "coordinator".
	LockKeyPrefix string
	// LockLayout is how locks are laid out in Redis: "coordinator" (the
	// default) or "redisson" (the lock of key K is Redisson's RLock named
	// K; docs/lock.md "Mixed fleets with Redisson"). The wiring maps it
	// onto the Redis adapter's option.
	LockLayout string
	// LockWaitTime bounds how long Acquire blocks. Default 5s.
	LockWaitTime time.Duration
	// LockWatchdogTimeout is the TTL of watchdog-managed leases. Default 30s.
	LockWatchdogTimeout time.Duration
	// LockWaitReplicas is how many replicas must acknowledge (Redis WAIT) an
	// acquisition or renewal: 0 auto (the replicas the master reports
	// online; the default), -1 none, N > 0 that many.
	LockWaitReplicas int
	// LockWaitReplicasTimeout bounds each WAIT. Default 200ms.
	LockWaitReplicasTimeout time.Duration

	// KafkaBrokers are the seed brokers. Default 127.0.0.1:9092.
	KafkaBrokers []string
	// KafkaCreateTopics creates missing contract topics at start. Default true.
	KafkaCreateTopics bool
	// KafkaGroup is the trigger consumer group. Default "coordinator".
	KafkaGroup string
	// KafkaSessionTimeout is the trigger consumer group's session timeout:
	// how long after a replica dies its partitions move. `serve` refuses a
	// LockWatchdogTimeout + LockWaitTime that reaches it. Default 45s.
	KafkaSessionTimeout time.Duration
	// KafkaTopicPrefix is prepended to every contract topic name. Default
	// empty; tests and shared clusters set it to isolate one deployment.
	KafkaTopicPrefix string
	// KafkaTLS dials the brokers over TLS. Default: true when any Kafka TLS
	// file is set, else false.
	KafkaTLS bool
	// KafkaTLSCAFile, KafkaTLSCertFile and KafkaTLSKeyFile are PEM files:
	// the CA bundle that verifies the brokers (default: the system roots)
	// and a client certificate and key (brokers with ssl.client.auth).
	KafkaTLSCAFile, KafkaTLSCertFile, KafkaTLSKeyFile string
	// KafkaSASLMechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty
	// means no SASL. Default empty.
	KafkaSASLMechanism string
	// KafkaMaxDecompressedBatchBytes bounds what one fetched trigger batch
	// may decompress to; a batch over it is skipped to the DLQ (reason
	// batch_too_large). Default 8 MiB, 1 MiB to 256 MiB.
	KafkaMaxDecompressedBatchBytes int
	// KafkaSASLUsername and KafkaSASLPassword are the SASL credentials
	// (the password also from COORDINATOR_KAFKA_SASL_PASSWORD_FILE).
	KafkaSASLUsername, KafkaSASLPassword string
	// kafkaTLSSet records that COORDINATOR_KAFKA_TLS was given explicitly.
	kafkaTLSSet bool

	// ReplicaID is the owner id in events and locks. Default hostname-pid.
	ReplicaID string
	// HTTPAddr is the admin/health/metrics listener. Default :8080.
	HTTPAddr string
	// AdminToken guards /v1/*; empty means /v1/* answers 403. At least
	// MinAdminTokenBytes long. Also from COORDINATOR_ADMIN_TOKEN_FILE.
	AdminToken string
	// AdminTokens are further named tokens with their scopes, from
	// COORDINATOR_ADMIN_TOKENS_FILE (name:scopes:token lines). Default none.
	AdminTokens []adminauth.Token
	// MaxRunsInFlight is how many runs (from any trigger) this replica may
	// have in flight before POST /v1/* answers 429. Default 8.
	MaxRunsInFlight int
	// HealthCheckInterval is how often the dependencies (Redis, Postgres,
	// Kafka) are checked in the background for /v1/health and
	// coordinator_dependency_up. Default 10s.
	HealthCheckInterval time.Duration

	// ReaperSchedule is a robfig/cron spec (seconds field optional). Default "@every 30s"; empty disables.
	ReaperSchedule string
	// ReaperLease is the reaper's explicit lease. Default 20s.
	ReaperLease time.Duration
	// ReaperBatchSize is rows freed per transaction. Default 1000.
	ReaperBatchSize int
	// ReaperMinHold keeps the sweep lock at least this long (ShedLock's
	// lockAtLeastFor). Default: half the schedule interval for @every specs, else 0.
	ReaperMinHold time.Duration

	// CronCatchUpWindow: on start, each schedule's most recent tick that
	// fell within this window before the start is run once (a tick missed
	// while the replica was down); the lock and the kind's claim answer if
	// another replica already ran it. Default 6h; 0 disables.
	CronCatchUpWindow time.Duration
	// CronJitter delays each cron tick (and catch-up) by a random duration
	// in [0, CronJitter), so replicas do not all hit Redis at once. Default
	// 0 (off), at most 10m.
	CronJitter time.Duration

	// BillrunSchedule bills the previous month when it fires. Default empty (off).
	BillrunSchedule string
	// BillrunBatchSize is subscribers per batch transaction. Default 2500 (billrun.DefaultBatchSize).
	BillrunBatchSize int
	// BillrunWorkers is the batch worker pool size. Default 4.
	BillrunWorkers int
	// BillingZone is the IANA zone billing months start and end in (at
	// midnight there); the bill-run schedule fires there unless its spec
	// names a CRON_TZ. COORDINATOR_BILLING_TZ, default UTC. Nil (a Config
	// built by hand) is UTC.
	BillingZone *time.Location
	// BillrunMaxAgeMonths is how many months back a period may be billed
	// without --force ("force": true). Default 24.
	BillrunMaxAgeMonths int

	// ResumeInterval is how often every replica's resumer looks for
	// accepted runs that did not complete and resumes the due ones.
	// Default 15s, 100ms..1h.
	ResumeInterval time.Duration
	// ResumeMaxAttempts bounds the resumer's attempts of one run that run
	// and do not complete; then it is permanent and pages. Default 10.
	ResumeMaxAttempts int
	// EventsRepublishAfter is how long a COMPLETED bill run's run.completed
	// may stay unacknowledged by Kafka before the resumers publish it
	// again (same event id). Default 2m, 1s..24h.
	EventsRepublishAfter time.Duration

	// ProgressInterval is how often a run in flight logs its progress
	// (<job>_progress records). Default 10s, at least 100ms.
	ProgressInterval time.Duration

	// ConsoleEnabled serves the operator console under /ui/ and keeps its
	// tables (run history, events index, heartbeats). Default true.
	ConsoleEnabled bool
	// ConsoleSessionTTL is how long a console login lasts. Default 8h.
	ConsoleSessionTTL time.Duration
	// ConsoleRetention is how long run history and indexed events are
	// kept. Default 720h (30 days), at least 1h.
	ConsoleRetention time.Duration
	// ConsoleHeartbeatInterval is how often a replica writes its heartbeat
	// row. Default 5s.
	ConsoleHeartbeatInterval time.Duration
	// ConsoleMaxStreams bounds the console's event streams per replica.
	// Default 100.
	ConsoleMaxStreams int

	// ShutdownTimeout bounds graceful shutdown. Default 30s.
	ShutdownTimeout time.Duration
	// LogLevel is debug, info, warn or error. Default info.
	LogLevel string
	// LogFormat is text or json. Default text.
	LogFormat string
}

// setting binds one variable to its flag, default and parser.
type setting struct {
	env   string
	flag  string
	usage string
	def   func(getenv func(string) string) string
	apply func(c *Config, v string) error
	// secret says how the value is shown in errors: not at all (opaque)
	// or with its password hidden (url).
	secret secrecy
	// file names the variable whose value is a file holding this setting
	// (ENV_FILE, flag --FLAG-file), for secrets that must not sit in the
	// environment or on the command line.
	file string
	// cmdline, when set, refuses values given as a flag: the command line
	// is readable by every local user (/proc/PID/cmdline, ps).
	cmdline func(v string) error
}

type secrecy int

const (
	public secrecy = iota
	secretURL
	secretOpaque
)

// MinAdminTokenBytes is the shortest admin token accepted (256 bits of hex
// or base64 is longer; a guessable word is shorter).
const MinAdminTokenBytes = adminauth.MinTokenBytes

// maxSecretFileBytes bounds what a *_FILE variable may point at.
const maxSecretFileBytes = 64 << 10

func refuseOnCommandLine(env string) func(string) error {
	return func(v string) error {
		if v == "" {
			return nil
		}
		return fmt.Errorf("a secret on the command line is visible to every local user (ps, /proc/PID/cmdline): set %s or %s_FILE instead", env, env)
	}
}

func refusePasswordOnCommandLine(env string) func(string) error {
	return func(v string) error {
		if !redact.HasPassword(v) {
			return nil
		}
		return fmt.Errorf("a password on the command line is visible to every local user (ps, /proc/PID/cmdline): set %s or %s_FILE instead", env, env)
	}
}

func lit(s string) func(func(string) string) string {
	return func(func(string) string) string { return s }
}

func fallback(env, def string) func(func(string) string) string {
	return func(getenv func(string) string) string {
		if v := getenv(env); v != "" {
			return v
		}
		return def
	}
}

func settings() []setting {
	return []setting{
		{env: "COORDINATOR_DATABASE_URL", flag: "database-url", usage: "Postgres DSN", def: fallback("DATABASE_URL", ""),
			apply: func(c *Config, v string) error { c.DatabaseURL = v; return checkPostgresURL(v) }, secret: secretURL,
			file: "COORDINATOR_DATABASE_URL_FILE", cmdline: refusePasswordOnCommandLine("COORDINATOR_DATABASE_URL")},
		{env: "COORDINATOR_LOCK_ENABLED", flag: "lock-enabled", usage: "false = single-replica mode with the in-memory locker", def: lit("true"),
			apply: func(c *Config, v string) (err error) { c.LockEnabled, err = strconv.ParseBool(v); return err }},
		{env: "COORDINATOR_LOCK_REDIS_URL", flag: "lock-redis-url", usage: "redis:// or rediss:// URL of the lock backend (go-redis format)", def: fallback("REDIS_URL", "redis://127.0.0.1:6379/0"),
			apply: func(c *Config, v string) error { c.LockRedisURL = v; return checkRedisURL(v) }, secret: secretURL,
			file: "COORDINATOR_LOCK_REDIS_URL_FILE", cmdline: refusePasswordOnCommandLine("COORDINATOR_LOCK_REDIS_URL")},
		{env: "COORDINATOR_LOCK_REDIS_PASSWORD_FILE", flag: "lock-redis-password-file", usage: "file holding the Redis password (when the URL has none)", def: lit(""),
			apply: func(c *Config, v string) (err error) {
				if v == "" {
					return nil
				}
				c.LockRedisPassword, err = readSecretFile(v)
				return err
			}},
		{env: "COORDINATOR_LOCK_REDIS_TLS_CA_FILE", flag: "lock-redis-tls-ca-file", usage: "PEM CA bundle verifying the Redis server (rediss://; default system roots)", def: lit(""),
			apply: func(c *Config, v string) error { c.LockRedisTLSCAFile = v; return nil }},
		{env: "COORDINATOR_LOCK_REDIS_TLS_CERT_FILE", flag: "lock-redis-tls-cert-file", usage: "PEM client certificate for Redis (with the key file)", def: lit(""),
			apply: func(c *Config, v string) error { c.LockRedisTLSCertFile = v; return nil }},
		{env: "COORDINATOR_LOCK_REDIS_TLS_KEY_FILE", flag: "lock-redis-tls-key-file", usage: "PEM private key of the Redis client certificate", def: lit(""),
			apply: func(c *Config, v string) error { c.LockRedisTLSKeyFile = v; return nil }},
		{env: "COORDINATOR_LOCK_REDIS_MODE", flag: "lock-redis-mode", usage: "single, sentinel or cluster", def: lit("single"),
			apply: func(c *Config, v string) error { c.LockRedisMode = v; return oneOf(v, "single", "sentinel", "cluster") }},
		{env: "COORDINATOR_LOCK_KEY_PREFIX", flag: "lock-key-prefix", usage: "prefix of every Redis key", def: lit("coordinator"),
			apply: func(c *Config, v string) error { c.LockKeyPrefix = v; return checkPrefix(v) }},
		{env: "COORDINATOR_LOCK_LAYOUT", flag: "lock-layout", usage: "coordinator, or redisson: a key's lock is Redisson's RLock of the same name (mixed fleets)", def: lit("coordinator"),
			apply: func(c *Config, v string) error {
				c.LockLayout = v
				return oneOf(v, LockLayoutCoordinator, LockLayoutRedisson)
			}},
		{env: "COORDINATOR_LOCK_WAIT_TIME", flag: "lock-wait-time", usage: "max time to block acquiring", def: lit("5s"),
			apply: func(c *Config, v string) (err error) { c.LockWaitTime, err = duration(v, 0); return err }},
		{env: "COORDINATOR_LOCK_WATCHDOG_TIMEOUT", flag: "lock-watchdog-timeout", usage: "TTL of watchdog-managed leases", def: lit("30s"),
			apply: func(c *Config, v string) (err error) {
				c.LockWatchdogTimeout, err = duration(v, 300*time.Millisecond)
				return err
			}},
		{env: "COORDINATOR_LOCK_REDIS_WAIT_REPLICAS", flag: "lock-redis-wait-replicas", usage: "replicas that must acknowledge an acquisition or renewal (WAIT): auto, none or a count", def: lit("auto"),
			apply: func(c *Config, v string) (err error) { c.LockWaitReplicas, err = waitReplicas(v); return err }},
		{env: "COORDINATOR_LOCK_REDIS_WAIT_TIMEOUT", flag: "lock-redis-wait-timeout", usage: "bound of each WAIT for replicas", def: lit("200ms"),
			apply: func(c *Config, v string) (err error) {
				c.LockWaitReplicasTimeout, err = duration(v, time.Millisecond)
				if err == nil && c.LockWaitReplicasTimeout > time.Second {
					err = errors.New("must be at most 1s (below the Redis read timeout)")
				}
				return err
			}},
		{env: "COORDINATOR_KAFKA_BROKERS", flag: "kafka-brokers", usage: "comma-separated seed brokers", def: lit("127.0.0.1:9092"),
			apply: func(c *Config, v string) error { c.KafkaBrokers = splitList(v); return checkBrokers(c.KafkaBrokers) }},
		{env: "COORDINATOR_KAFKA_CREATE_TOPICS", flag: "kafka-create-topics", usage: "create missing contract topics at start", def: lit("true"),
			apply: func(c *Config, v string) (err error) { c.KafkaCreateTopics, err = strconv.ParseBool(v); return err }},
		{env: "COORDINATOR_KAFKA_GROUP", flag: "kafka-group", usage: "consumer group of the trigger consumer", def: lit("coordinator"),
			apply: func(c *Config, v string) error { c.KafkaGroup = v; return checkName(v) }},
		{env: "COORDINATOR_KAFKA_SESSION_TIMEOUT", flag: "kafka-session-timeout", usage: "session timeout of the trigger consumer group (a dead replica's partitions move after it)", def: lit("45s"),
			apply: func(c *Config, v string) (err error) {
				c.KafkaSessionTimeout, err = duration(v, time.Second)
				if err == nil && c.KafkaSessionTimeout > 30*time.Minute {
					err = errors.New("must be at most 30m")
				}
				return err
			}},
		{env: "COORDINATOR_KAFKA_TOPIC_PREFIX", flag: "kafka-topic-prefix", usage: "prefix of every contract topic (isolates tests and tenants)", def: lit(""),
			apply: func(c *Config, v string) error {
				c.KafkaTopicPrefix = v
				if v == "" {
					return nil
				}
				return checkName(v)
			}},
		{env: "COORDINATOR_KAFKA_TLS", flag: "kafka-tls", usage: "dial the brokers over TLS (default true when a Kafka TLS file is set)", def: lit(""),
			apply: func(c *Config, v string) (err error) {
				if v == "" {
					return nil
				}
				c.kafkaTLSSet = true
				c.KafkaTLS, err = strconv.ParseBool(v)
				return err
			}},
		{env: "COORDINATOR_KAFKA_TLS_CA_FILE", flag: "kafka-tls-ca-file", usage: "PEM CA bundle verifying the brokers (default system roots)", def: lit(""),
			apply: func(c *Config, v string) error { c.KafkaTLSCAFile = v; return nil }},
		{env: "COORDINATOR_KAFKA_TLS_CERT_FILE", flag: "kafka-tls-cert-file", usage: "PEM client certificate for the brokers (with the key file)", def: lit(""),
			apply: func(c *Config, v string) error { c.KafkaTLSCertFile = v; return nil }},
		{env: "COORDINATOR_KAFKA_TLS_KEY_FILE", flag: "kafka-tls-key-file", usage: "PEM private key of the Kafka client certificate", def: lit(""),
			apply: func(c *Config, v string) error { c.KafkaTLSKeyFile = v; return nil }},
		{env: "COORDINATOR_KAFKA_MAX_DECOMPRESSED_BATCH_BYTES", flag: "kafka-max-decompressed-batch-bytes", usage: "bound on what one fetched trigger batch may decompress to; a batch over it is skipped to the DLQ (batch_too_large)", def: lit("8388608"),
			apply: func(c *Config, v string) (err error) {
				c.KafkaMaxDecompressedBatchBytes, err = intBetween(v, 1<<20, 256<<20)
				return err
			}},
		{env: "COORDINATOR_KAFKA_SASL_MECHANISM", flag: "kafka-sasl-mechanism", usage: "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (empty: no SASL)", def: lit(""),
			apply: func(c *Config, v string) error {
				c.KafkaSASLMechanism = strings.ToUpper(v)
				if v == "" {
					return nil
				}
				return oneOf(c.KafkaSASLMechanism, SASLPlain, SASLScramSHA256, SASLScramSHA512)
			}},
		{env: "COORDINATOR_KAFKA_SASL_USERNAME", flag: "kafka-sasl-username", usage: "SASL user name", def: lit(""),
			apply: func(c *Config, v string) error { c.KafkaSASLUsername = v; return nil }},
		{env: "COORDINATOR_KAFKA_SASL_PASSWORD", flag: "kafka-sasl-password", usage: "SASL password; refused as a flag", def: lit(""),
			apply: func(c *Config, v string) error { c.KafkaSASLPassword = v; return nil }, secret: secretOpaque,
			file: "COORDINATOR_KAFKA_SASL_PASSWORD_FILE", cmdline: refuseOnCommandLine("COORDINATOR_KAFKA_SASL_PASSWORD")},
		{env: "COORDINATOR_REPLICA_ID", flag: "replica-id", usage: "owner id shown in events and locks (default hostname-pid)", def: lit(""),
			apply: func(c *Config, v string) error { c.ReplicaID = v; return checkReplicaID(v) }},
		{env: "COORDINATOR_HTTP_ADDR", flag: "http-addr", usage: "admin API, health and metrics listener", def: lit(":8080"),
			apply: func(c *Config, v string) error { c.HTTPAddr = v; return checkAddr(v) }},
		{env: "COORDINATOR_ADMIN_TOKEN", flag: "admin-token", usage: "bearer token for /v1/*, at least 32 bytes (unset = 403); refused as a flag", def: lit(""),
			apply: func(c *Config, v string) error { c.AdminToken = v; return checkAdminToken(v) }, secret: secretOpaque,
			file: "COORDINATOR_ADMIN_TOKEN_FILE", cmdline: refuseOnCommandLine("COORDINATOR_ADMIN_TOKEN")},
		{env: "COORDINATOR_ADMIN_TOKENS_FILE", flag: "admin-tokens-file", usage: "file of name:scopes:token lines: named admin tokens with read and/or mutate scopes", def: lit(""),
			apply: func(c *Config, v string) error {
				if v == "" {
					return nil
				}
				content, err := readSecretFile(v)
				if err != nil {
					return err
				}
				c.AdminTokens, err = adminauth.ParseFile(content)
				return err
			}},
		{env: "COORDINATOR_MAX_RUNS_IN_FLIGHT", flag: "max-runs-in-flight", usage: "runs in flight on this replica (any trigger) at which POST /v1/* answers 429", def: lit("8"),
			apply: func(c *Config, v string) (err error) { c.MaxRunsInFlight, err = positiveInt(v, 1024); return err }},
		{env: "COORDINATOR_HEALTH_CHECK_INTERVAL", flag: "health-check-interval", usage: "how often the dependencies are checked in the background (/v1/health)", def: lit("10s"),
			apply: func(c *Config, v string) (err error) {
				c.HealthCheckInterval, err = duration(v, 100*time.Millisecond)
				return err
			}},
		{env: "COORDINATOR_REAPER_SCHEDULE", flag: "reaper-schedule", usage: "robfig/cron spec of the MSISDN reaper; empty disables", def: lit("@every 30s"),
			apply: func(c *Config, v string) error { c.ReaperSchedule = v; return checkSchedule(v) }},
		{env: "COORDINATOR_REAPER_LEASE", flag: "reaper-lease", usage: "explicit lease of one sweep", def: lit("20s"),
			apply: func(c *Config, v string) (err error) {
				c.ReaperLease, err = duration(v, 100*time.Millisecond)
				return err
			}},
		{env: "COORDINATOR_REAPER_BATCH_SIZE", flag: "reaper-batch-size", usage: "reservations freed per transaction", def: lit("1000"),
			apply: func(c *Config, v string) (err error) { c.ReaperBatchSize, err = positiveInt(v, 100000); return err }},
		{env: "COORDINATOR_REAPER_MIN_HOLD", flag: "reaper-min-hold", usage: "minimum time a sweep keeps its lock (default half the @every interval)", def: lit(""),
			apply: func(c *Config, v string) (err error) {
				if v == "" {
					c.ReaperMinHold = defaultMinHold(c.ReaperSchedule)
					return nil
				}
				c.ReaperMinHold, err = duration(v, 0)
				return err
			}},
		{env: "COORDINATOR_CRON_CATCHUP_WINDOW", flag: "cron-catchup-window", usage: "on start, run each schedule's latest tick missed within this window (0 disables)", def: lit("6h"),
			apply: func(c *Config, v string) (err error) {
				c.CronCatchUpWindow, err = duration(v, 0)
				if err == nil && c.CronCatchUpWindow > 31*24*time.Hour {
					err = errors.New("must be at most 744h (31 days)")
				}
				return err
			}},
		{env: "COORDINATOR_CRON_JITTER", flag: "cron-jitter", usage: "random delay in [0, jitter) before each cron tick (0 disables)", def: lit("0s"),
			apply: func(c *Config, v string) (err error) {
				c.CronJitter, err = duration(v, 0)
				if err == nil && c.CronJitter > 10*time.Minute {
					err = errors.New("must be at most 10m")
				}
				return err
			}},
		{env: "COORDINATOR_BILLRUN_SCHEDULE", flag: "billrun-schedule", usage: "cron spec that bills the previous month; empty disables", def: lit(""),
			apply: func(c *Config, v string) error { c.BillrunSchedule = v; return checkSchedule(v) }},
		{env: "COORDINATOR_BILLRUN_BATCH_SIZE", flag: "billrun-batch-size", usage: "subscribers per batch (one statement)", def: lit("2500"),
			apply: func(c *Config, v string) (err error) { c.BillrunBatchSize, err = positiveInt(v, 100000); return err }},
		{env: "COORDINATOR_BILLRUN_WORKERS", flag: "billrun-workers", usage: "concurrent batch transactions", def: lit("4"),
			apply: func(c *Config, v string) (err error) { c.BillrunWorkers, err = positiveInt(v, 256); return err }},
		{env: "COORDINATOR_BILLING_TZ", flag: "billing-tz", usage: "IANA time zone billing months start and end in (at midnight)", def: lit("UTC"),
			apply: func(c *Config, v string) (err error) { c.BillingZone, err = zone(v); return err }},
		{env: "COORDINATOR_BILLRUN_MAX_AGE_MONTHS", flag: "billrun-max-age-months", usage: "months back a period may be billed without --force", def: lit("24"),
			apply: func(c *Config, v string) (err error) { c.BillrunMaxAgeMonths, err = positiveInt(v, 12000); return err }},
		{env: "COORDINATOR_RESUME_INTERVAL", flag: "resume-interval", usage: "how often the resumer looks for accepted runs that did not complete", def: lit("15s"),
			apply: func(c *Config, v string) (err error) {
				c.ResumeInterval, err = duration(v, 100*time.Millisecond)
				if err == nil && c.ResumeInterval > time.Hour {
					err = errors.New("must be at most 1h")
				}
				return err
			}},
		{env: "COORDINATOR_RESUME_MAX_ATTEMPTS", flag: "resume-max-attempts", usage: "resume attempts of one run before it is permanent and pages", def: lit("10"),
			apply: func(c *Config, v string) (err error) { c.ResumeMaxAttempts, err = positiveInt(v, 1000); return err }},
		{env: "COORDINATOR_EVENTS_REPUBLISH_AFTER", flag: "events-republish-after", usage: "how long a completed bill run's run.completed may stay unacknowledged by Kafka before the resumers publish it again (same id)", def: lit("2m"),
			apply: func(c *Config, v string) (err error) {
				c.EventsRepublishAfter, err = duration(v, time.Second)
				if err == nil && c.EventsRepublishAfter > 24*time.Hour {
					err = errors.New("must be at most 24h")
				}
				return err
			}},
		{env: "COORDINATOR_PROGRESS_INTERVAL", flag: "progress-interval", usage: "how often a run in flight logs its progress (<job>_progress)", def: lit("10s"),
			apply: func(c *Config, v string) (err error) {
				c.ProgressInterval, err = duration(v, 100*time.Millisecond)
				return err
			}},
		{env: "COORDINATOR_CONSOLE_ENABLED", flag: "console-enabled", usage: "serve the operator console under /ui/ and keep its tables (run history, events index, heartbeats)", def: lit("true"),
			apply: func(c *Config, v string) (err error) { c.ConsoleEnabled, err = strconv.ParseBool(v); return err }},
		{env: "COORDINATOR_CONSOLE_SESSION_TTL", flag: "console-session-ttl", usage: "how long a console login lasts (1m to 168h)", def: lit("8h"),
			apply: func(c *Config, v string) (err error) {
				if c.ConsoleSessionTTL, err = duration(v, time.Minute); err == nil && c.ConsoleSessionTTL > 7*24*time.Hour {
					err = errors.New("at most 168h")
				}
				return err
			}},
		{env: "COORDINATOR_CONSOLE_RETENTION", flag: "console-retention", usage: "how long the run history and the events index keep rows", def: lit("720h"),
			apply: func(c *Config, v string) (err error) { c.ConsoleRetention, err = duration(v, time.Hour); return err }},
		{env: "COORDINATOR_CONSOLE_HEARTBEAT_INTERVAL", flag: "console-heartbeat-interval", usage: "how often a replica writes its heartbeat row (missing after 3)", def: lit("5s"),
			apply: func(c *Config, v string) (err error) {
				c.ConsoleHeartbeatInterval, err = duration(v, 100*time.Millisecond)
				return err
			}},
		{env: "COORDINATOR_CONSOLE_MAX_STREAMS", flag: "console-max-streams", usage: "console event streams open at once on a replica (more answer 503)", def: lit("100"),
			apply: func(c *Config, v string) (err error) { c.ConsoleMaxStreams, err = positiveInt(v, 10000); return err }},
		{env: "COORDINATOR_SHUTDOWN_TIMEOUT", flag: "shutdown-timeout", usage: "bound on graceful shutdown", def: lit("30s"),
			apply: func(c *Config, v string) (err error) { c.ShutdownTimeout, err = duration(v, time.Second); return err }},
		{env: "COORDINATOR_LOG_LEVEL", flag: "log-level", usage: "debug, info, warn or error", def: lit("info"),
			apply: func(c *Config, v string) error { c.LogLevel = v; return oneOf(v, "debug", "info", "warn", "error") }},
		{env: "COORDINATOR_LOG_FORMAT", flag: "log-format", usage: "text or json", def: lit("text"),
			apply: func(c *Config, v string) error { c.LogFormat = v; return oneOf(v, "text", "json") }},
	}
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

// Binding ties the configuration flags to a FlagSet that may carry a
// command's own flags too.
type Binding struct {
	fs       *flag.FlagSet
	getenv   func(string) string
	vals     []*string
	fileVals []*string
}

// Bind adds every configuration flag to fs, each with its type and its
// default (as the environment leaves it; secrets are not shown) in -h.
// After fs.Parse, call Config.
func Bind(fs *flag.FlagSet, getenv func(string) string) *Binding {
	if getenv == nil {
		getenv = os.Getenv
	}
	b := &Binding{fs: fs, getenv: getenv}
	for _, s := range settings() {
		typ := cmpOr(flagTypes[s.flag], "string")
		v := &flagValue{bool: typ == "bool"}
		if s.secret == public {
			v.raw = s.def(getenv)
		}
		// A back-quoted type is what -h shows after the flag's name; a bool
		// flag takes no argument, so it shows none.
		quoted := "`" + typ + "`"
		if v.bool {
			quoted = typ
		}
		fs.Var(v, s.flag, fmt.Sprintf("%s (%s, $%s)", s.usage, quoted, s.env))
		v.raw = ""
		b.vals = append(b.vals, &v.raw)
		var fv *string
		if s.file != "" {
			fv = fs.String(s.flag+"-file", "", "file holding the value of --"+s.flag+" (`path`, $"+s.file+")")
		}
		b.fileVals = append(b.fileVals, fv)
	}
	return b
}

// flagTypes name each flag's type in -h (string when absent); "bool" flags
// also take no argument (--lock-enabled=false).
var flagTypes = map[string]string{
	"database-url": "dsn", "lock-enabled": "bool", "lock-redis-url": "url", "lock-wait-time": "duration",
	"lock-watchdog-timeout": "duration", "kafka-brokers": "host:port,...", "kafka-create-topics": "bool",
	"http-addr": "host:port", "reaper-schedule": "cron", "reaper-lease": "duration", "reaper-batch-size": "int",
	"reaper-min-hold": "duration", "billrun-schedule": "cron", "billrun-batch-size": "int", "billrun-workers": "int",
	"shutdown-timeout": "duration", "log-level": "level", "log-format": "format",
	"kafka-tls": "bool", "kafka-tls-ca-file": "path", "kafka-tls-cert-file": "path", "kafka-tls-key-file": "path",
	"kafka-sasl-mechanism": "mechanism", "lock-redis-tls-ca-file": "path", "lock-redis-tls-cert-file": "path",
	"lock-redis-tls-key-file": "path", "lock-redis-password-file": "path", "admin-token": "token",
	"admin-tokens-file": "path", "max-runs-in-flight": "int", "health-check-interval": "duration",
	"kafka-sasl-password": "password", "kafka-max-decompressed-batch-bytes": "bytes",
	"cron-catchup-window": "duration", "cron-jitter": "duration", "kafka-session-timeout": "duration",
	"resume-interval": "duration", "resume-max-attempts": "int", "lock-layout": "layout",
	"console-enabled": "bool", "console-session-ttl": "duration", "console-retention": "duration",
	"console-heartbeat-interval": "duration", "console-max-streams": "int",
}

// The values of COORDINATOR_LOCK_LAYOUT.
const (
	LockLayoutCoordinator = "coordinator"
	LockLayoutRedisson    = "redisson"
)

// flagValue keeps a flag's raw text: Config parses it with the variable's
// own rules, so that a bad flag value is reported like a bad variable.
type flagValue struct {
	raw  string
	bool bool
}

func (v *flagValue) String() string {
	if v == nil {
		return ""
	}
	return v.raw
}

func (v *flagValue) Set(s string) error { v.raw = s; return nil }

func (v *flagValue) IsBoolFlag() bool { return v != nil && v.bool }

// Config reads the environment, then the parsed flags (a flag wins over its
// variable), fills defaults and validates. Nothing is contacted; files named
// by *_FILE variables and TLS files are read.
func (b *Binding) Config() (Config, error) {
	set := map[string]bool{}
	b.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var c Config
	for i, s := range settings() {
		v := b.getenv(s.env)
		fromFlag := set[s.flag]
		if fromFlag {
			v = *b.vals[i]
			if s.cmdline != nil {
				if err := s.cmdline(v); err != nil {
					return Config{}, &Error{Variable: s.env, Flag: s.flag, Value: s.show(v), Err: err}
				}
			}
		}
		variable, flagName, fromFile := s.env, s.flag, ""
		if s.file != "" {
			path := b.getenv(s.file)
			if set[s.flag+"-file"] {
				path = *b.fileVals[i]
			}
			if path != "" {
				variable, flagName, fromFile = s.file, s.flag+"-file", path
				if v != "" {
					return Config{}, &Error{Variable: s.file, Flag: flagName, Value: path,
						Err: fmt.Errorf("%s is set too: set one of them", s.env)}
				}
				content, err := readSecretFile(path)
				if err != nil {
					return Config{}, &Error{Variable: s.file, Flag: flagName, Value: path, Err: err}
				}
				v = content
			}
		}
		if v == "" && !fromFlag && fromFile == "" {
			v = s.def(b.getenv)
		}
		if err := s.apply(&c, v); err != nil {
			shown := s.show(v)
			if fromFile != "" {
				shown = fromFile
			}
			return Config{}, &Error{Variable: variable, Flag: flagName, Value: shown, Err: err}
		}
	}
	if c.ReplicaID == "" {
		host, _ := os.Hostname()
		c.ReplicaID = fmt.Sprintf("%s-%d", cmpOr(host, "replica"), os.Getpid())
	}
	return c, c.validate()
}

// show is how the value appears in an error.
func (s setting) show(v string) string {
	switch {
	case v == "":
		return ""
	case s.secret == secretURL:
		return redact.URL(v)
	case s.secret == secretOpaque:
		return redact.Mask
	}
	return v
}

// Load is Bind plus Parse for commands with no flags of their own. It returns
// the arguments left after the flags.
func Load(name string, args []string, getenv func(string) string) (Config, []string, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	b := Bind(fs, getenv)
	if err := fs.Parse(args); err != nil {
		return Config{}, nil, err
	}
	c, err := b.Config()
	return c, fs.Args(), err
}

// validate checks rules that span variables.
func (c Config) validate() error {
	if c.LockWaitTime > c.LockWatchdogTimeout*10 {
		return &Error{Variable: "COORDINATOR_LOCK_WAIT_TIME", Flag: "lock-wait-time", Value: c.LockWaitTime.String(),
			Err: fmt.Errorf("must not exceed 10x COORDINATOR_LOCK_WATCHDOG_TIMEOUT (%s)", c.LockWatchdogTimeout)}
	}
	if err := c.validateRedis(); err != nil {
		return err
	}
	if err := adminauth.Check(c.AdminTokenSet()); err != nil {
		return &Error{Variable: "COORDINATOR_ADMIN_TOKENS_FILE", Flag: "admin-tokens-file", Value: "",
			Err: fmt.Errorf("%w (COORDINATOR_ADMIN_TOKEN is the token named %q)", err, adminauth.SingleTokenName)}
	}
	return c.validateKafka()
}

// CheckKafkaSession refuses, for `serve`, a lock watchdog timeout plus wait
// time that reaches the Kafka session timeout: a dead owner's partition
// would then move while its lock is still held, and the new member would
// answer already_owned to its trigger.
func (c Config) CheckKafkaSession() error {
	session := c.KafkaSessionTimeout
	if session == 0 {
		session = DefaultKafkaSessionTimeout
	}
	if c.LockWatchdogTimeout+c.LockWaitTime < session {
		return nil
	}
	return &Error{Variable: "COORDINATOR_LOCK_WATCHDOG_TIMEOUT", Flag: "lock-watchdog-timeout", Value: c.LockWatchdogTimeout.String(),
		Err: fmt.Errorf("plus COORDINATOR_LOCK_WAIT_TIME (%s) must stay below COORDINATOR_KAFKA_SESSION_TIMEOUT (%s): lower them or raise the session timeout",
			c.LockWaitTime, session)}
}

// DefaultKafkaSessionTimeout is COORDINATOR_KAFKA_SESSION_TIMEOUT's
// default (franz-go's and Kafka's).
const DefaultKafkaSessionTimeout = 45 * time.Second

// AdminTokenSet is every admin token: COORDINATOR_ADMIN_TOKEN (named
// "admin", every scope) and those of COORDINATOR_ADMIN_TOKENS_FILE. Empty:
// the admin API is disabled (/v1/* answers 403).
func (c Config) AdminTokenSet() []adminauth.Token {
	var out []adminauth.Token
	if c.AdminToken != "" {
		out = append(out, adminauth.Token{Name: adminauth.SingleTokenName, Scopes: adminauth.All, Secret: c.AdminToken})
	}
	return append(out, c.AdminTokens...)
}

func (c Config) validateRedis() error {
	urlErr := func(err error) error {
		return &Error{Variable: "COORDINATOR_LOCK_REDIS_URL", Flag: "lock-redis-url", Value: redact.URL(c.LockRedisURL), Err: err}
	}
	opts, err := redislock.ParseOptions(c.LockRedisURL, c.LockRedisMode)
	if err != nil {
		return urlErr(err)
	}
	if c.LockRedisPassword != "" && opts.Password != "" {
		return urlErr(errors.New("carries a password and COORDINATOR_LOCK_REDIS_PASSWORD_FILE is set: keep the password in one place"))
	}
	files := c.LockRedisTLSFiles()
	if !files.Any() {
		return nil
	}
	if opts.TLSConfig == nil {
		return urlErr(errors.New("the COORDINATOR_LOCK_REDIS_TLS_* files need a rediss:// URL"))
	}
	return checkTLSFiles(files)
}

// checkTLSFiles loads the files once, so a bad one stops start-up naming it.
func checkTLSFiles(files tlsfiles.Files) error {
	_, err := files.Config()
	var te *tlsfiles.Error
	if errors.As(err, &te) {
		return &Error{Variable: te.Variable, Flag: flagOf(te.Variable), Value: te.Path, Err: te.Err}
	}
	return err
}

// flagOf is the flag of a COORDINATOR_* variable.
func flagOf(env string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(env, "COORDINATOR_")), "_", "-")
}

func (c Config) validateKafka() error {
	files := c.KafkaTLSFiles()
	if files.Any() {
		if c.kafkaTLSSet && !c.KafkaTLS {
			return &Error{Variable: "COORDINATOR_KAFKA_TLS", Flag: "kafka-tls", Value: "false",
				Err: errors.New("contradicts the COORDINATOR_KAFKA_TLS_* files that are set")}
		}
		if err := checkTLSFiles(files); err != nil {
			return err
		}
	}
	saslErr := func(variable, flag, value, msg string) error {
		return &Error{Variable: variable, Flag: flag, Value: value, Err: errors.New(msg)}
	}
	switch {
	case c.KafkaSASLMechanism == "" && (c.KafkaSASLUsername != "" || c.KafkaSASLPassword != ""):
		return saslErr("COORDINATOR_KAFKA_SASL_MECHANISM", "kafka-sasl-mechanism", "",
			"required when a SASL user name or password is set (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)")
	case c.KafkaSASLMechanism == "":
	case c.KafkaSASLUsername == "":
		return saslErr("COORDINATOR_KAFKA_SASL_USERNAME", "kafka-sasl-username", "",
			"required with COORDINATOR_KAFKA_SASL_MECHANISM="+c.KafkaSASLMechanism)
	case c.KafkaSASLPassword == "":
		return saslErr("COORDINATOR_KAFKA_SASL_PASSWORD", "kafka-sasl-password", "",
			"required with COORDINATOR_KAFKA_SASL_MECHANISM="+c.KafkaSASLMechanism+" (or COORDINATOR_KAFKA_SASL_PASSWORD_FILE)")
	case c.KafkaSASLMechanism == SASLPlain && !c.KafkaTLSEnabled():
		return saslErr("COORDINATOR_KAFKA_SASL_MECHANISM", "kafka-sasl-mechanism", SASLPlain,
			"PLAIN sends the password in clear text: enable TLS (COORDINATOR_KAFKA_TLS=true or a COORDINATOR_KAFKA_TLS_* file) or use SCRAM")
	}
	return nil
}

// SASL mechanisms of COORDINATOR_KAFKA_SASL_MECHANISM.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// KafkaTLSEnabled reports whether Kafka clients dial over TLS: explicitly,
// or because a TLS file is set.
func (c Config) KafkaTLSEnabled() bool {
	if c.kafkaTLSSet {
		return c.KafkaTLS
	}
	return c.KafkaTLS || c.KafkaTLSFiles().Any()
}

// KafkaTLSFiles are the Kafka clients' PEM files.
func (c Config) KafkaTLSFiles() tlsfiles.Files {
	return tlsfiles.Files{CA: c.KafkaTLSCAFile, Cert: c.KafkaTLSCertFile, Key: c.KafkaTLSKeyFile,
		CAVar: "COORDINATOR_KAFKA_TLS_CA_FILE", CertVar: "COORDINATOR_KAFKA_TLS_CERT_FILE", KeyVar: "COORDINATOR_KAFKA_TLS_KEY_FILE"}
}

// LockRedisTLSFiles are the Redis client's PEM files.
func (c Config) LockRedisTLSFiles() tlsfiles.Files {
	return tlsfiles.Files{CA: c.LockRedisTLSCAFile, Cert: c.LockRedisTLSCertFile, Key: c.LockRedisTLSKeyFile,
		CAVar: "COORDINATOR_LOCK_REDIS_TLS_CA_FILE", CertVar: "COORDINATOR_LOCK_REDIS_TLS_CERT_FILE", KeyVar: "COORDINATOR_LOCK_REDIS_TLS_KEY_FILE"}
}

// RequireDatabase returns an error naming the variable when no DSN is set.
func (c Config) RequireDatabase() error {
	if c.DatabaseURL == "" {
		return &Error{Variable: "COORDINATOR_DATABASE_URL", Flag: "database-url", Value: "",
			Err: errors.New("required (or DATABASE_URL)")}
	}
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func duration(v string, min time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("not a duration (examples: 500ms, 5s, 1m)")
	}
	if d < min {
		return 0, fmt.Errorf("must be at least %s", min)
	}
	return d, nil
}

func positiveInt(v string, max int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, errors.New("not an integer")
	}
	if n < 1 || n > max {
		return 0, fmt.Errorf("must be between 1 and %d", max)
	}
	return n, nil
}

func intBetween(v string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, errors.New("not an integer (bytes)")
	}
	if n < lo || n > hi {
		return 0, fmt.Errorf("must be between %d and %d", lo, hi)
	}
	return n, nil
}

func oneOf(v string, allowed ...string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return fmt.Errorf("must be one of %s", strings.Join(allowed, ", "))
}

func splitList(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func checkBrokers(bs []string) error {
	if len(bs) == 0 {
		return errors.New("at least one broker is required")
	}
	for _, b := range bs {
		if i := strings.LastIndexByte(b, ':'); i <= 0 || i == len(b)-1 {
			return fmt.Errorf("broker %q is not host:port", b)
		} else if _, err := strconv.ParseUint(b[i+1:], 10, 16); err != nil {
			return fmt.Errorf("broker %q has a bad port", b)
		}
	}
	return nil
}

func checkPostgresURL(v string) error {
	if v == "" {
		return nil // required only by commands that touch Postgres
	}
	if strings.HasPrefix(v, "postgres://") || strings.HasPrefix(v, "postgresql://") {
		if _, err := url.Parse(v); err != nil {
			return errors.New("not a valid URL")
		}
		return nil
	}
	if strings.Contains(v, "=") { // keyword/value DSN
		return nil
	}
	return errors.New("must be a postgres:// URL or a key=value DSN")
}

// checkRedisURL is the check that needs no mode; validate parses the URL
// with go-redis once the mode is known.
func checkRedisURL(v string) error {
	if !strings.HasPrefix(v, "redis://") && !strings.HasPrefix(v, "rediss://") {
		return errors.New("scheme must be redis:// or rediss://")
	}
	return nil
}

func checkAdminToken(v string) error {
	if v != "" {
		return adminauth.CheckSecret(v)
	}
	return nil
}

// waitReplicas parses auto (0), none (-1) or a count 1..16.
func waitReplicas(v string) (int, error) {
	switch v {
	case "auto":
		return 0, nil
	case "none":
		return -1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 16 {
		return 0, errors.New("must be auto, none or a count from 1 to 16")
	}
	return n, nil
}

// readSecretFile returns the content of a *_FILE variable's file without
// its final line break (files written by echo or editors have one).
func readSecretFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFileBytes+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxSecretFileBytes {
		return "", fmt.Errorf("larger than %d bytes", maxSecretFileBytes)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	if len(b) == 0 {
		return "", errors.New("the file is empty")
	}
	return string(b), nil
}

func checkPrefix(v string) error {
	if v == "" || strings.ContainsAny(v, "{} \t\n") {
		return errors.New("must be non-empty without braces or whitespace")
	}
	return nil
}

func checkReplicaID(v string) error {
	if len(v) > 128 || strings.ContainsAny(v, " \t\n") {
		return errors.New("must be at most 128 characters without whitespace")
	}
	return nil
}

// checkName accepts Kafka's topic/group character set.
func checkName(v string) error {
	if v == "" || len(v) > 200 {
		return errors.New("must be 1 to 200 characters")
	}
	for _, r := range v {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("character %q not allowed (use A-Z a-z 0-9 . _ -)", r)
		}
	}
	return nil
}

func checkAddr(v string) error {
	i := strings.LastIndexByte(v, ':')
	if i < 0 {
		return errors.New("must be host:port or :port")
	}
	if _, err := strconv.ParseUint(v[i+1:], 10, 16); err != nil {
		return errors.New("bad port")
	}
	return nil
}

// CronParser accepts an optional seconds field, descriptors (@every 30s,
// @hourly) and CRON_TZ=/TZ= prefixes.
var CronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// zone loads an IANA time zone name ("Europe/Berlin", "UTC"). "Local"
// and the empty name are refused: billing must not depend on the host.
func zone(v string) (*time.Location, error) {
	if v == "" || v == "Local" {
		return nil, errors.New("want an IANA time zone name, e.g. UTC or Europe/Berlin")
	}
	loc, err := time.LoadLocation(v)
	if err != nil {
		return nil, fmt.Errorf("unknown time zone (want an IANA name, e.g. Europe/Berlin): %w", err)
	}
	return loc, nil
}

func checkSchedule(v string) error {
	if v == "" {
		return nil
	}
	if _, err := CronParser.Parse(v); err != nil {
		return fmt.Errorf("not a cron spec: %v", err)
	}
	return nil
}

func defaultMinHold(schedule string) time.Duration {
	const every = "@every "
	if !strings.HasPrefix(schedule, every) {
		return 0
	}
	d, err := time.ParseDuration(strings.TrimPrefix(schedule, every))
	if err != nil {
		return 0
	}
	return d / 2
}

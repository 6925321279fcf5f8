package config

import (
	"errors"
	"strings"
	"time"

	"github.com/telco-platform/coordinator/internal/base10"
	"github.com/telco-platform/coordinator/internal/redact"
	"github.com/telco-platform/coordinator/internal/tlsfiles"
)

// Lock is the ownership lock's backend. cmd/coordinator's lock wiring maps
// it onto redislock's Config (or the in-memory Locker's).
type Lock struct {
	// Enabled false runs single-replica mode with the in-memory locker.
	// Default true.
	Enabled bool
	// RedisURL is redis:// or rediss:// in go-redis' own formats
	// (redis.ParseURL, ParseFailoverURL, ParseClusterURL by RedisMode).
	// Default REDIS_URL, else redis://127.0.0.1:6379/0.
	RedisURL string
	// RedisPassword, from COORDINATOR_LOCK_REDIS_PASSWORD_FILE, is the
	// Redis data nodes' password when the URL carries none. Default empty.
	RedisPassword string
	// RedisTLSCAFile, RedisTLSCertFile and RedisTLSKeyFile are PEM files
	// for rediss://: the CA bundle that verifies the server (default: the
	// system roots) and a client certificate and key.
	RedisTLSCAFile, RedisTLSCertFile, RedisTLSKeyFile string
	// RedisMode is single, sentinel or cluster. Default single.
	RedisMode string
	// KeyPrefix prefixes every Redis key. Default "coordinator".
	KeyPrefix string
	// Layout is how locks are laid out in Redis: LockLayoutCoordinator (the
	// default) or LockLayoutRedisson (the lock of key K is Redisson's RLock
	// named K; docs/lock.md "Mixed fleets with Redisson"). The wiring maps
	// it onto the Redis adapter's option.
	Layout string
	// WaitTime bounds how long Acquire blocks. Default 5s.
	WaitTime time.Duration
	// WatchdogTimeout is the TTL of watchdog-managed leases. Default 30s.
	WatchdogTimeout time.Duration
	// WaitReplicas is how many replicas must acknowledge (Redis WAIT) an
	// acquisition or renewal: 0 auto (the replicas the master reports
	// online; the default), -1 none, N > 0 that many.
	WaitReplicas int
	// WaitReplicasTimeout bounds each WAIT. Default 200ms.
	WaitReplicasTimeout time.Duration
}

// The values of COORDINATOR_LOCK_LAYOUT.
const (
	LockLayoutCoordinator = "coordinator"
	LockLayoutRedisson    = "redisson"
)

// RedisTLSFiles are the Redis client's PEM files.
func (l Lock) RedisTLSFiles() tlsfiles.Files {
	return tlsfiles.Files{CA: l.RedisTLSCAFile, Cert: l.RedisTLSCertFile, Key: l.RedisTLSKeyFile,
		CAVar: "COORDINATOR_LOCK_REDIS_TLS_CA_FILE", CertVar: "COORDINATOR_LOCK_REDIS_TLS_CERT_FILE", KeyVar: "COORDINATOR_LOCK_REDIS_TLS_KEY_FILE"}
}

func lockSettings() []setting {
	return []setting{
		boolean("COORDINATOR_LOCK_ENABLED", "lock-enabled", "false = single-replica mode with the in-memory locker", "true",
			func(c *Config) *bool { return &c.Lock.Enabled }).in(sectionContract, "`false` = single-replica mode with the in-memory locker, loudly logged"),
		text("COORDINATOR_LOCK_REDIS_URL", "lock-redis-url", "url", "redis:// or rediss:// URL of the lock backend (go-redis format)", "redis://127.0.0.1:6379/0",
			func(c *Config) *string { return &c.Lock.RedisURL }, checkRedisURL).
			in(sectionContract, "`redis://` or `rediss://` in go-redis' formats, by mode ([Redis URLs](#redis-urls))").
			secretIn(secretURL, "COORDINATOR_LOCK_REDIS_URL_FILE").withFallback("REDIS_URL"),
		enum("COORDINATOR_LOCK_REDIS_MODE", "lock-redis-mode", "how the URL reaches Redis", "single",
			func(c *Config) *string { return &c.Lock.RedisMode }, "single", "sentinel", "cluster").
			in(sectionContract, "`single`, `sentinel`, `cluster`"),
		dur("COORDINATOR_LOCK_WAIT_TIME", "lock-wait-time", "max time to block acquiring", "5s", 0, 0,
			func(c *Config) *time.Duration { return &c.Lock.WaitTime }).in(sectionContract, "longest time to block acquiring (at most 10x the watchdog timeout; `0`: do not wait, one try)"),
		dur("COORDINATOR_LOCK_WATCHDOG_TIMEOUT", "lock-watchdog-timeout", "TTL of watchdog-managed leases", "30s", 300*time.Millisecond, 0,
			func(c *Config) *time.Duration { return &c.Lock.WatchdogTimeout }).in(sectionContract, "TTL of watchdog-managed leases, renewed every third of it (min 300ms)"),
		text("COORDINATOR_LOCK_KEY_PREFIX", "lock-key-prefix", "prefix", "prefix of every Redis key", "coordinator",
			func(c *Config) *string { return &c.Lock.KeyPrefix }, checkPrefix).in(sectionFurther, "prefix of every Redis key: `coordinator:{billrun:2026-11}:lock`, `:fence`, `:queue`, `:tickets`, `:ended:F`, and of the wake channels `coordinator:wake:<Locker id>` ([lock.md](lock.md#keys-and-channels)); no braces or whitespace, glob characters are literal"),
		enum("COORDINATOR_LOCK_LAYOUT", "lock-layout", "coordinator, or redisson: a key's lock is Redisson's RLock of the same name (mixed fleets)",
			LockLayoutCoordinator, func(c *Config) *string { return &c.Lock.Layout }, LockLayoutCoordinator, LockLayoutRedisson).
			in(sectionFurther, "how locks are laid out in Redis: `coordinator` (the lock of key K is `<prefix>:{K}:lock`), or `redisson`: the lock of K is the Redisson lock name K itself, so that Java services using Redisson's `RLock` on the same names and the coordinator exclude each other and wake each other's waiters ([lock.md](lock.md#mixed-fleets-with-redisson)); every replica of a fleet must use the same layout; any other value stops start-up (exit 64)"),
		{env: "COORDINATOR_LOCK_REDIS_WAIT_REPLICAS", flag: "lock-redis-wait-replicas", typ: "auto|none|count",
			usage: "replicas that must acknowledge an acquisition or renewal (WAIT): auto, none or a count", def: "auto",
			section: sectionFurther, doc: "replicas that must acknowledge (Redis `WAIT`) an acquisition or renewal: `auto` (those the master reports online), `none`, or a count 1..16; fewer = the acquisition fails closed, the renewal does not count ([lock.md](lock.md#replicas-wait-and-failover))",
			apply: func(c *Config, v string) (err error) { c.Lock.WaitReplicas, err = waitReplicas(v); return err }},
		{env: "COORDINATOR_LOCK_REDIS_WAIT_TIMEOUT", flag: "lock-redis-wait-timeout", typ: "duration", usage: "bound of each WAIT for replicas",
			def: "200ms", section: sectionFurther, doc: "bound of each `WAIT` (1ms..1s)",
			apply: func(c *Config, v string) (err error) {
				c.Lock.WaitReplicasTimeout, err = duration(v, time.Millisecond, 0)
				if err == nil && c.Lock.WaitReplicasTimeout > time.Second {
					err = errors.New("must be at most 1s (below the Redis read timeout)")
				}
				return err
			}},
		{env: "COORDINATOR_LOCK_REDIS_PASSWORD_FILE", flag: "lock-redis-password-file", typ: "path",
			usage: "file holding the Redis password (when the URL has none)", section: sectionTransport,
			doc: "file holding the Redis (data nodes') password, for a URL that carries none (`rediss://coordinator@host:6380/0`); a URL with a password too is exit 64",
			apply: func(c *Config, v string) (err error) {
				if v == "" {
					return nil
				}
				c.Lock.RedisPassword, err = readSecretFile(v)
				return err
			}},
		path("COORDINATOR_LOCK_REDIS_TLS_CA_FILE", "lock-redis-tls-ca-file", "PEM CA bundle verifying the Redis server (rediss://; default system roots)",
			func(c *Config) *string { return &c.Lock.RedisTLSCAFile }).
			in(sectionTransport, "PEM CA bundle that verifies the Redis server (needs `rediss://`)").documented("system roots"),
		path("COORDINATOR_LOCK_REDIS_TLS_CERT_FILE", "lock-redis-tls-cert-file", "PEM client certificate for Redis (with the key file)",
			func(c *Config) *string { return &c.Lock.RedisTLSCertFile }).in(sectionTransport, "PEM client certificate (chain) for Redis; with the key file"),
		path("COORDINATOR_LOCK_REDIS_TLS_KEY_FILE", "lock-redis-tls-key-file", "PEM private key of the Redis client certificate",
			func(c *Config) *string { return &c.Lock.RedisTLSKeyFile }).in(sectionTransport, "its PEM private key"),
	}
}

// validate checks the rules that span the lock's settings, and what needs
// no Redis client: the TLS files load, and they come with a rediss:// URL.
// The URL itself is go-redis' to parse, at the edge (cmd/coordinator's lock
// wiring), which reports its errors as *Error too.
func (l Lock) validate() error {
	if l.WaitTime > l.WatchdogTimeout*10 {
		return &Error{Variable: "COORDINATOR_LOCK_WAIT_TIME", Flag: "lock-wait-time", Value: l.WaitTime.String(),
			Err: errorf("must not exceed 10x COORDINATOR_LOCK_WATCHDOG_TIMEOUT (%s)", l.WatchdogTimeout)}
	}
	files := l.RedisTLSFiles()
	if !files.Any() {
		return nil
	}
	if !strings.HasPrefix(l.RedisURL, "rediss://") {
		return &Error{Variable: "COORDINATOR_LOCK_REDIS_URL", Flag: "lock-redis-url", Value: redact.URL(l.RedisURL),
			Err: errors.New("the COORDINATOR_LOCK_REDIS_TLS_* files need a rediss:// URL")}
	}
	return checkTLSFiles(files)
}

// checkRedisURL is the check that needs no mode and no go-redis.
func checkRedisURL(v string) error {
	if !strings.HasPrefix(v, "redis://") && !strings.HasPrefix(v, "rediss://") {
		return errors.New("scheme must be redis:// or rediss://")
	}
	return nil
}

// checkPrefix refuses what Redis Cluster hash tags or globs would misread.
func checkPrefix(v string) error {
	if v == "" || strings.ContainsAny(v, "{} \t\n") {
		return errors.New("must be non-empty without braces or whitespace")
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
	n, err := base10.Parse(v)
	if err != nil || n < 1 || n > 16 {
		return 0, errors.New("must be auto, none or a count from 1 to 16 (base 10)")
	}
	return int(n), nil
}

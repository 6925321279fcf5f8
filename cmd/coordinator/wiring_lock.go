package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/redact"
)

// openLocker builds the process's one Locker from the configuration:
// redislock on COORDINATOR_LOCK_REDIS_URL, or, with
// COORDINATOR_LOCK_ENABLED=false, the in-memory Locker (single-replica mode,
// loudly logged). Closing the Locker also closes its Redis client. The
// returned Locker is also an ownership.Inspector; the Redis one has
// Ping(ctx) error for readiness. A Redis whose eviction policy can evict
// lock keys is refused with a *config.Error naming
// COORDINATOR_LOCK_REDIS_URL (an evicted lock lets a second holder in); one that
// does not answer yet only logs, and acquisitions fail closed until it does.
func openLocker(ctx context.Context, cfg config.Config, log *slog.Logger, reg prometheus.Registerer) (ownership.Locker, error) {
	return openLockerMinTrust(ctx, cfg, log, reg, 0)
}

// openLockerMinTrust is openLocker whose Redis Locker gives back an
// acquisition answered with less than minTrust left of its trust window,
// and waits on (redislock.Config.MinTrust): `coordinator lock` needs its
// grace and kill margin.
func openLockerMinTrust(ctx context.Context, cfg config.Config, log *slog.Logger, reg prometheus.Registerer, minTrust time.Duration) (ownership.Locker, error) {
	metrics := ownership.NewMetrics(reg)
	if !cfg.Lock.Enabled {
		log.Warn("lock_disabled_single_replica_mode",
			"detail", "COORDINATOR_LOCK_ENABLED=false: in-memory locker, NO exclusion across replicas; run exactly one replica",
			"owner", cfg.ReplicaID)
		return ownership.NewMemoryLocker(ownership.MemoryConfig{
			Owner: cfg.ReplicaID, WaitTime: lockerWait(cfg.Lock.WaitTime), WatchdogTimeout: cfg.Lock.WatchdogTimeout, Metrics: metrics,
		}), nil
	}
	opts, err := redisOptions(cfg)
	if err != nil {
		return nil, err
	}
	layout, err := redislock.ParseLayout(cfg.Lock.Layout)
	if err != nil {
		return nil, fmt.Errorf("COORDINATOR_LOCK_LAYOUT: %w", err)
	}
	client := redis.NewUniversalClient(opts)
	l, err := redislock.New(client, redislock.Config{
		Prefix: cfg.Lock.KeyPrefix, Owner: cfg.ReplicaID, WaitTime: lockerWait(cfg.Lock.WaitTime),
		WatchdogTimeout: cfg.Lock.WatchdogTimeout, Logger: log, Metrics: metrics,
		WaitReplicas: cfg.Lock.WaitReplicas, ReplicaTimeout: cfg.Lock.WaitReplicasTimeout,
		Layout: layout, MinTrust: minTrust,
	})
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	checkCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	switch err := l.CheckServer(checkCtx); {
	case errors.Is(err, redislock.ErrUnsafeEviction):
		// A configuration error (exit 64 from every command): trying again
		// changes nothing until the server's policy or the URL does.
		_ = l.Close()
		_ = client.Close()
		return nil, &config.Error{Variable: "COORDINATOR_LOCK_REDIS_URL", Flag: "lock-redis-url", Value: redact.URL(cfg.Lock.RedisURL), Err: err}
	case err != nil:
		// Not fatal: acquisitions fail closed until Redis answers (and are
		// refused then, if its eviction policy turns out unsafe).
		log.Warn("lock_backend_unreachable", "mode", cfg.Lock.RedisMode, "error", err)
	}
	return &clientLocker{Locker: l, client: client}, nil
}

// lockerWait is the Lockers' WaitTime for COORDINATOR_LOCK_WAIT_TIME (or
// lock's --wait). Zero there means do not wait: one try. A Locker takes a
// zero WaitTime for its default (5s), so it gets the shortest wait instead,
// which still makes its one try.
func lockerWait(d time.Duration) time.Duration {
	if d == 0 {
		return time.Nanosecond
	}
	return d
}

// checkLockSettings parses COORDINATOR_LOCK_REDIS_URL with go-redis, by
// COORDINATOR_LOCK_REDIS_MODE, as the lock will: a URL it refuses, or one
// carrying a password while COORDINATOR_LOCK_REDIS_PASSWORD_FILE is set,
// stops the command at start naming the variable (exit 64), like every
// setting internal/config checks. The configuration itself imports no
// Redis client.
func checkLockSettings(cfg config.Config) error {
	urlErr := func(err error) error {
		return &config.Error{Variable: "COORDINATOR_LOCK_REDIS_URL", Flag: "lock-redis-url", Value: redact.URL(cfg.Lock.RedisURL), Err: err}
	}
	opts, err := redislock.ParseOptions(cfg.Lock.RedisURL, cfg.Lock.RedisMode)
	if err != nil {
		return urlErr(err)
	}
	if cfg.Lock.RedisPassword != "" && opts.Password != "" {
		return urlErr(errors.New("carries a password and COORDINATOR_LOCK_REDIS_PASSWORD_FILE is set: keep the password in one place"))
	}
	if cfg.Lock.RedisTLSFiles().Any() && opts.TLSConfig == nil {
		return urlErr(errors.New("the COORDINATOR_LOCK_REDIS_TLS_* files need a rediss:// URL"))
	}
	return nil
}

// redisOptions are the go-redis options of the lock backend: the URL
// (go-redis' own formats, by COORDINATOR_LOCK_REDIS_MODE), the password of
// COORDINATOR_LOCK_REDIS_PASSWORD_FILE and, for rediss://, the CA and client
// certificate of the COORDINATOR_LOCK_REDIS_TLS_* files.
func redisOptions(cfg config.Config) (*redis.UniversalOptions, error) {
	opts, err := redislock.ParseOptions(cfg.Lock.RedisURL, cfg.Lock.RedisMode)
	if err != nil {
		return nil, err
	}
	if cfg.Lock.RedisPassword != "" {
		opts.Password = cfg.Lock.RedisPassword
	}
	// Test builds only (testhooks): the chaos verifier's proxies.
	if dial, err := redisTestDialer(cmp.Or(opts.DialTimeout, redislock.DefaultDialTimeout)); err != nil {
		return nil, err
	} else if dial != nil {
		opts.Dialer = dial
	}
	if files := cfg.Lock.RedisTLSFiles(); files.Any() {
		if opts.TLSConfig == nil {
			return nil, errors.New("redis: the COORDINATOR_LOCK_REDIS_TLS_* files need a rediss:// URL")
		}
		if err := files.Apply(opts.TLSConfig); err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
	}
	return opts, nil
}

// clientLocker closes the Redis client after the Locker.
type clientLocker struct {
	*redislock.Locker
	client redis.UniversalClient
}

// RedisClient is the lock backend's client, for its tracing and pool
// metrics.
func (c *clientLocker) RedisClient() redis.UniversalClient { return c.client }

func (c *clientLocker) Close() error {
	err := c.Locker.Close()
	if cerr := c.client.Close(); cerr != nil && !errors.Is(cerr, redis.ErrClosed) {
		err = errors.Join(err, cerr)
	}
	return err
}

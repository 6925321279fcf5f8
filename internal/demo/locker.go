package demo

import (
	"context"
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
)

// openRedisLocker is each replica's Locker: the Redis adapter on the demo's
// own redis-server (single mode, the replica's settings).
func openRedisLocker(_ context.Context, cfg config.Config, log *slog.Logger, reg prometheus.Registerer) (ownership.Locker, error) {
	client, err := redislock.NewClient(cfg.Lock.RedisURL, cfg.Lock.RedisMode)
	if err != nil {
		return nil, err
	}
	l, err := redislock.New(client, redislock.Config{Prefix: cfg.Lock.KeyPrefix, Owner: cfg.ReplicaID,
		WaitTime: cfg.Lock.WaitTime, WatchdogTimeout: cfg.Lock.WatchdogTimeout, Logger: log, Metrics: ownership.NewMetrics(reg)})
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	return &closingLocker{Locker: l, client: client}, nil
}

// closingLocker closes the Redis client after the Locker.
type closingLocker struct {
	*redislock.Locker
	client redis.UniversalClient
}

func (c *closingLocker) Close() error {
	err := c.Locker.Close()
	if cerr := c.client.Close(); cerr != nil && !errors.Is(cerr, redis.ErrClosed) {
		err = errors.Join(err, cerr)
	}
	return err
}

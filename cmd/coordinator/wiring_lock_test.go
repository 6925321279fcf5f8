package main

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func TestOpenLockerDisabledIsLoudMemoryLocker(t *testing.T) {
	t.Parallel()
	cfg, _, err := config.Load("test", nil, func(k string) string {
		return map[string]string{"COORDINATOR_LOCK_ENABLED": "false", "COORDINATOR_REPLICA_ID": "solo"}[k]
	})
	require.NoError(t, err)
	var logs bytes.Buffer
	l, err := openLocker(context.Background(), cfg, slog.New(slog.NewTextHandler(&logs, nil)), prometheus.NewRegistry())
	require.NoError(t, err)
	defer l.Close()
	require.IsType(t, &ownership.MemoryLocker{}, l)
	require.Equal(t, "solo", l.Owner())
	require.Contains(t, logs.String(), "level=WARN")
	require.Contains(t, logs.String(), "NO exclusion across replicas")
}

func TestOpenLockerRedis(t *testing.T) {
	t.Parallel()
	r := testenv.Redis(t)
	cfg, _, err := config.Load("test", nil, func(k string) string {
		return map[string]string{"COORDINATOR_LOCK_REDIS_URL": r.URL, "COORDINATOR_LOCK_KEY_PREFIX": r.Prefix,
			"COORDINATOR_REPLICA_ID": "r1", "COORDINATOR_LOCK_WATCHDOG_TIMEOUT": "1s"}[k]
	})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	l, err := openLocker(context.Background(), cfg, slog.New(slog.DiscardHandler), reg)
	require.NoError(t, err)
	ctx := context.Background()
	le, err := l.Acquire(ctx, "wiring/k", 0)
	require.NoError(t, err)
	n, err := r.Client.Exists(ctx, r.Prefix+":{wiring/k}:lock").Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the lock lives under the configured prefix")
	pinger, ok := l.(interface{ Ping(context.Context) error })
	require.True(t, ok, "readiness needs Ping")
	require.NoError(t, pinger.Ping(ctx))
	_, ok = l.(ownership.Inspector)
	require.True(t, ok)
	require.NoError(t, le.Release(ctx))
	require.NoError(t, l.Close())
	require.NoError(t, l.Close(), "Close twice")
	// The client is closed with the Locker.
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	require.Error(t, pinger.Ping(pctx))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	require.NotEmpty(t, mfs, "metrics registered")
}

// A Redis that may evict lock keys is refused at start, naming the setting.
func TestOpenLockerRefusesAnEvictingRedis(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServerWith(t, testenv.RedisServerOptions{Args: []string{"--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"}})
	cfg, _, err := config.Load("test", nil, func(k string) string {
		return map[string]string{"COORDINATOR_LOCK_REDIS_URL": srv.URL(), "COORDINATOR_REPLICA_ID": "r1"}[k]
	})
	require.NoError(t, err)
	_, err = openLocker(context.Background(), cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	require.ErrorContains(t, err, "COORDINATOR_LOCK_REDIS_URL")
	require.ErrorContains(t, err, "maxmemory-policy volatile-lru")
	require.ErrorContains(t, err, "noeviction")
}

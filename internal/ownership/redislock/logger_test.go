package redislock_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// go-redis has one logger for the process; through SetLogger its lines are
// slog records. A client through Sentinel logs the master it discovered.
func TestGoRedisLogLinesAreSlogRecords(t *testing.T) {
	env := testenv.RedisSentinel(t)
	log, recs := testenv.NewRecords(slog.LevelInfo)
	redislock.SetLogger(log)
	t.Cleanup(func() { redislock.SetLogger(slog.New(slog.DiscardHandler)) })

	client, err := redislock.NewClient(env.URL, redislock.ModeSentinel)
	require.NoError(t, err)
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, client.Ping(ctx).Err())

	rec := recs.Wait(t, 10*time.Second, "go-redis' sentinel line", func(r slog.Record) bool {
		return r.Message == "redis_client_log" && strings.HasPrefix(testenv.Attrs(r)["detail"].String(), "sentinel: ")
	})
	require.Equal(t, slog.LevelInfo, rec.Level)
}

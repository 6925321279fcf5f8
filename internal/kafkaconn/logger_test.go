package kafkaconn_test

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/kafkaconn"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// franzClient is a client the way the coordinator's are built (Options with
// a logger), on brokers.
func franzClient(t *testing.T, log *slog.Logger, brokers []string) *kgo.Client {
	t.Helper()
	opts, err := kafkaconn.Options(kafkaconn.Config{}, log)
	require.NoError(t, err)
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

func TestFranzGoLogLinesAreSlogRecords(t *testing.T) {
	t.Parallel()
	k := testenv.Kafka(t)
	log, recs := testenv.NewRecords(slog.LevelDebug)
	cl := franzClient(t, log, k.Brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cl.Ping(ctx))

	// Connecting to the broker is one of franz-go's debug lines.
	rec := recs.Wait(t, 10*time.Second, "a franz-go line", func(r slog.Record) bool {
		return r.Message == "kafka_client_log" && r.Level == slog.LevelDebug
	})
	a := testenv.Attrs(rec)
	require.NotEmpty(t, a["detail"].String(), "franz-go's message")
}

func TestFranzGoErrorIsUnderTheErrorKey(t *testing.T) {
	t.Parallel()
	// A seed broker that refuses connections: franz-go warns with its "err".
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	log, recs := testenv.NewRecords(slog.LevelWarn)
	cl := franzClient(t, log, []string{addr})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	require.Error(t, cl.Ping(ctx))

	// The recorder keeps Warn and above only: finding the record proves its level.
	rec := recs.Wait(t, 10*time.Second, "franz-go's warning with an error", func(r slog.Record) bool {
		_, ok := testenv.Attrs(r)["error"]
		return r.Message == "kafka_client_log" && ok
	})
	a := testenv.Attrs(rec)
	require.NotContains(t, a, "err", "franz-go's err key is renamed")
	require.Contains(t, a["error"].String(), "refused")
}

func TestFranzGoLinesBelowTheLevelAreNotFormatted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		level slog.Level
		want  kgo.LogLevel
	}{
		{slog.LevelDebug, kgo.LogLevelDebug},
		{slog.LevelInfo, kgo.LogLevelInfo},
		{slog.LevelWarn, kgo.LogLevelWarn},
		{slog.LevelError, kgo.LogLevelError},
		{slog.LevelError + 4, kgo.LogLevelNone},
	} {
		log, _ := testenv.NewRecords(tc.level)
		require.Equal(t, tc.want, kafkaconn.Logger(log).Level(), "slog level %v", tc.level)
	}
}

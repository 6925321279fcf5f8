package kafkaconn

import (
	"context"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Logger is a franz-go logger that writes franz-go's own log lines (broker
// connections, group rebalances, retries) to log as records of the
// constant message "kafka_client_log": franz-go's message under "detail",
// its key/value pairs as they are, but its "err" under "error" like every
// other record of the coordinator. franz-go's levels map to slog's; what log
// does not enable franz-go does not format.
func Logger(log *slog.Logger) kgo.Logger { return franzLogger{log: log} }

type franzLogger struct{ log *slog.Logger }

var franzLevels = []struct {
	kgo  kgo.LogLevel
	slog slog.Level
}{
	{kgo.LogLevelDebug, slog.LevelDebug},
	{kgo.LogLevelInfo, slog.LevelInfo},
	{kgo.LogLevelWarn, slog.LevelWarn},
	{kgo.LogLevelError, slog.LevelError},
}

func (l franzLogger) Level() kgo.LogLevel {
	for _, lv := range franzLevels {
		if l.log.Enabled(context.Background(), lv.slog) {
			return lv.kgo
		}
	}
	return kgo.LogLevelNone
}

func (l franzLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	sl := slog.LevelError
	for _, lv := range franzLevels {
		if lv.kgo == level {
			sl = lv.slog
		}
	}
	args := make([]any, 0, len(keyvals)+2)
	args = append(args, "detail", msg)
	for i, kv := range keyvals {
		if i%2 == 0 && kv == "err" {
			kv = "error"
		}
		args = append(args, kv)
	}
	l.log.Log(context.Background(), sl, "kafka_client_log", args...)
}

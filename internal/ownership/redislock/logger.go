package redislock

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// SetLogger makes log go-redis' logger. go-redis has one logger for the
// whole process (sentinel discovery and failover, pool and connection
// trouble, push notifications), which otherwise prints unstructured lines to
// stderr; through SetLogger each becomes a warning record of the constant
// message "redis_client_log" with go-redis' line under "detail". A nil log
// is ignored.
func SetLogger(log *slog.Logger) {
	if log == nil {
		return
	}
	redis.SetLogger(printfLogger{log: log})
}

// printfLogger is go-redis' logging interface (Printf with a context) over
// slog. go-redis gives its lines no level; at its default level it logs
// only what is worth a warning.
type printfLogger struct{ log *slog.Logger }

func (l printfLogger) Printf(ctx context.Context, format string, v ...any) {
	if !l.log.Enabled(ctx, slog.LevelWarn) {
		return
	}
	l.log.Log(ctx, slog.LevelWarn, "redis_client_log", "detail", fmt.Sprintf(format, v...))
}

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
// stderr; through SetLogger each becomes an info record of the constant
// message "redis_client_log" with go-redis' line under "detail". A nil log
// is ignored.
func SetLogger(log *slog.Logger) {
	if log == nil {
		return
	}
	redis.SetLogger(printfLogger{log: log})
}

// printfLogger is go-redis' logging interface (Printf with a context) over
// slog. go-redis gives its lines no level, and they mix news (the master
// Sentinel named, a failover) with trouble the lock also reports in its own
// records (a dial that failed): info, so they stay out of a warn-level log.
type printfLogger struct{ log *slog.Logger }

func (l printfLogger) Printf(ctx context.Context, format string, v ...any) {
	if !l.log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	l.log.Log(ctx, slog.LevelInfo, "redis_client_log", "detail", fmt.Sprintf(format, v...))
}

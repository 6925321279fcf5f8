package events

import (
	"context"
	"log/slog"
	"sort"
)

// NewLogEmitter returns an Emitter that writes every event as one structured
// log line (message "ownership_event"): warnings for the events an operator
// acts on (unavailable, lost, failed, conflicts, rejected triggers), info for
// the rest. Data fields beyond the named ones follow, sorted by name. The
// replica id is left to the logger (newLogger adds it to every line), since
// every event a process emits carries its own replica.
func NewLogEmitter(log *slog.Logger) Emitter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return logEmitter{log: log}
}

type logEmitter struct{ log *slog.Logger }

func (l logEmitter) Emit(ctx context.Context, e Event) {
	level := slog.LevelInfo
	switch e.Type {
	case OwnershipUnavailable, OwnershipLost, RunFailed, BillrunInvoiceConflict, BillrunLateUsage, TriggerRejected:
		level = slog.LevelWarn
	}
	if !l.log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 10+len(e.Extra))
	attrs = append(attrs,
		slog.String("type", string(e.Type)),
		slog.String("lock_key", e.Key),
		slog.String("job", e.Job),
		slog.String("trigger", e.Trigger),
		slog.String("request_id", e.RequestID),
	)
	if e.ID != "" {
		attrs = append(attrs, slog.String("event_id", e.ID))
	}
	if e.Fence != 0 {
		attrs = append(attrs, slog.Int64("fence", e.Fence))
	}
	if e.Owner != "" {
		attrs = append(attrs, slog.String("owner", e.Owner))
	}
	if id := TraceID(e.TraceParent); id != "" {
		attrs = append(attrs, slog.String("trace_id", id))
	}
	keys := make([]string, 0, len(e.Extra))
	for k := range e.Extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		attrs = append(attrs, slog.Any(k, e.Extra[k]))
	}
	l.log.LogAttrs(ctx, level, "ownership_event", attrs...)
}

package testenv

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Records is a slog handler that keeps every record it is given at or
// above its level, for tests that wait for a log line.
type Records struct {
	level slog.Level
	mu    sync.Mutex
	recs  []slog.Record
}

// NewRecords returns a logger on a new Records handler of level.
func NewRecords(level slog.Level) (*slog.Logger, *Records) {
	r := &Records{level: level}
	return slog.New(r), r
}

func (r *Records) Enabled(_ context.Context, l slog.Level) bool { return l >= r.level }

func (r *Records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

// WithAttrs and WithGroup are not kept apart: the tests read the records'
// own attributes.
func (r *Records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *Records) WithGroup(string) slog.Handler      { return r }

// Wait returns the first record that match accepts, waiting up to within.
func (r *Records) Wait(t testing.TB, within time.Duration, what string, match func(slog.Record) bool) slog.Record {
	t.Helper()
	var found slog.Record
	require.Eventually(t, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, rec := range r.recs {
			if match(rec) {
				found = rec
				return true
			}
		}
		return false
	}, within, 10*time.Millisecond, "no log record: %s", what)
	return found
}

// Attrs are a record's attributes by key (values resolved).
func Attrs(rec slog.Record) map[string]slog.Value {
	m := map[string]slog.Value{}
	rec.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.Resolve()
		return true
	})
	return m
}

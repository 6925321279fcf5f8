package consoledb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/telco-platform/coordinator/internal/console"
)

// HeartbeatConfig configures a replica's heartbeat row.
type HeartbeatConfig struct {
	Pool    *pgxpool.Pool
	Replica string
	Version string
	// Interval between upserts. Required.
	Interval time.Duration
	// Ready, Dependencies and Runs are read at each beat (nil: false, none).
	Ready        func() bool
	Dependencies func() []console.Dependency
	Runs         func() []console.InFlight
	Log          *slog.Logger
	Metrics      *Metrics
}

// Heartbeat upserts the replica's row in replica_heartbeats every
// Interval: version, start, readiness, dependency checks and runs in
// flight. The console shows a replica not seen for 3 intervals as
// missing; Stop marks it stopped.
type Heartbeat struct {
	cfg     HeartbeatConfig
	started time.Time
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// NewHeartbeat checks cfg.
func NewHeartbeat(cfg HeartbeatConfig) (*Heartbeat, error) {
	if cfg.Pool == nil || cfg.Replica == "" || cfg.Interval <= 0 {
		return nil, errors.New("consoledb: the heartbeat needs Pool, Replica and a positive Interval")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Heartbeat{cfg: cfg, stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Start writes the first beat (an error is logged, not returned: the
// console is no reason to stop a replica) and beats in the background.
func (h *Heartbeat) Start(ctx context.Context) {
	h.started = time.Now()
	h.beat(ctx, false)
	go func() {
		defer close(h.done)
		t := time.NewTicker(h.cfg.Interval)
		defer t.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-t.C:
				h.beat(context.Background(), false)
			}
		}
	}()
}

// Stop ends the beats and marks the replica stopped. Safe twice.
func (h *Heartbeat) Stop(ctx context.Context) {
	h.once.Do(func() {
		close(h.stop)
		<-h.done
		h.beat(ctx, true)
	})
}

const sqlBeat = `
insert into replica_heartbeats as h (replica, version, started_at, seen_at, stopped_at, ready, dependencies, runs)
values ($1, $2, $3, now(), case when $4 then now() end, $5, $6, $7)
on conflict (replica) do update
set version = excluded.version, started_at = excluded.started_at, seen_at = excluded.seen_at,
    stopped_at = excluded.stopped_at, ready = excluded.ready, dependencies = excluded.dependencies,
    runs = excluded.runs`

func (h *Heartbeat) beat(ctx context.Context, stopped bool) {
	deps, runs := []console.Dependency{}, []console.InFlight{}
	if h.cfg.Dependencies != nil {
		deps = append(deps, h.cfg.Dependencies()...)
	}
	if h.cfg.Runs != nil && !stopped {
		runs = append(runs, h.cfg.Runs()...)
	}
	ready := h.cfg.Ready != nil && h.cfg.Ready() && !stopped
	dj, err := json.Marshal(deps)
	if err == nil {
		var rj []byte
		if rj, err = json.Marshal(runs); err == nil {
			ctx, cancel := context.WithTimeout(ctx, max(h.cfg.Interval, time.Second))
			_, err = h.cfg.Pool.Exec(ctx, sqlBeat, h.cfg.Replica, h.cfg.Version, h.started, stopped, ready, dj, rj)
			cancel()
		}
	}
	if err != nil {
		h.cfg.Metrics.failed("replica_heartbeats")
		h.cfg.Log.Warn("heartbeat_failed", "error", err)
	}
}

// JanitorConfig configures the retention of the console's tables.
type JanitorConfig struct {
	Pool *pgxpool.Pool
	// Retention is how long runs and events are kept. Required.
	Retention time.Duration
	// Interval between passes. Default 1h.
	Interval time.Duration
	Log      *slog.Logger
}

// Janitor deletes run history and events older than the retention,
// expired sessions, and heartbeats of replicas gone for a day, in chunks
// (no long lock), once at start and then every Interval. Every replica
// runs one; their deletes do not conflict.
type Janitor struct {
	cfg  JanitorConfig
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// NewJanitor checks cfg.
func NewJanitor(cfg JanitorConfig) (*Janitor, error) {
	if cfg.Pool == nil || cfg.Retention <= 0 {
		return nil, errors.New("consoledb: the janitor needs Pool and a positive Retention")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Hour
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Janitor{cfg: cfg, stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// Start runs a pass soon and then every Interval, in the background.
func (j *Janitor) Start() {
	go func() {
		defer close(j.done)
		t := time.NewTimer(5 * time.Second) // not in the start-up rush
		defer t.Stop()
		for {
			select {
			case <-j.stop:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-j.stop:
					cancel()
				case <-ctx.Done():
				}
			}()
			if n, err := j.Prune(ctx); err != nil {
				j.cfg.Log.Warn("console_prune_failed", "error", err)
			} else if n > 0 {
				j.cfg.Log.Info("console_pruned", "rows", n, "retention", j.cfg.Retention.String())
			}
			cancel()
			t.Reset(j.cfg.Interval)
		}
	}()
}

// Stop ends the janitor (a pass under way is cancelled). Safe twice.
func (j *Janitor) Stop() {
	j.once.Do(func() {
		close(j.stop)
		<-j.done
	})
}

// pruneChunk bounds one delete statement.
const pruneChunk = 5000

// Prune deletes what is past retention and returns the rows deleted.
func (j *Janitor) Prune(ctx context.Context) (int64, error) {
	secs := j.cfg.Retention.Seconds()
	stmts := []struct {
		sql  string
		args []any
	}{
		{`delete from run_history where id in
		    (select id from run_history where ended_at < now() - make_interval(secs => $1) limit $2)`, []any{secs, pruneChunk}},
		{`delete from ownership_events where id in
		    (select id from ownership_events where event_time < now() - make_interval(secs => $1) limit $2)`, []any{secs, pruneChunk}},
		{`delete from console_sessions where id_hash in
		    (select id_hash from console_sessions where expires_at < now() limit $1)`, []any{pruneChunk}},
		{`delete from replica_heartbeats where seen_at < now() - interval '1 day'`, nil},
	}
	var total int64
	for _, st := range stmts {
		for {
			tag, err := j.cfg.Pool.Exec(ctx, st.sql, st.args...)
			if err != nil {
				return total, fmt.Errorf("consoledb: prune: %w", err)
			}
			total += tag.RowsAffected()
			if st.args == nil || tag.RowsAffected() < pruneChunk {
				break
			}
		}
	}
	return total, nil
}

package consoledb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/postgres"
)

// Metrics are the console tables' series; a nil *Metrics records nothing.
type Metrics struct {
	dropped *prometheus.CounterVec
	errors  *prometheus.CounterVec
}

// NewMetrics registers the series on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "coordinator_console_records_dropped_total",
			Help: "Console records (run history rows) dropped because Postgres did not take them before the bounded buffer filled."},
			[]string{"table"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "coordinator_console_write_errors_total",
			Help: "Failed writes to the console's tables (retried), by table."}, []string{"table"}),
	}
	for _, t := range []string{"run_history", "ownership_events", "replica_heartbeats"} {
		m.dropped.WithLabelValues(t)
		m.errors.WithLabelValues(t)
	}
	if reg != nil {
		reg.MustRegister(m.dropped, m.errors)
	}
	return m
}

func (m *Metrics) drop(table string, n int) {
	if m != nil && n > 0 {
		m.dropped.WithLabelValues(table).Add(float64(n))
	}
}

func (m *Metrics) failed(table string) {
	if m != nil {
		m.errors.WithLabelValues(table).Inc()
	}
}

// Defaults of HistoryWriter.
const (
	DefaultHistoryBuffer = 4096
	historyBatch         = 256
	retryFirst           = 250 * time.Millisecond
	retryMax             = 5 * time.Second
)

// HistoryWriter is the template's owned.RunHistory: RunEnded puts the
// record in a bounded buffer and never waits; a goroutine writes what is
// buffered in one statement, and retries with backoff while Postgres
// refuses. A record that finds the buffer full is dropped and counted
// (coordinator_console_records_dropped_total{table="run_history"}).
type HistoryWriter struct {
	pool    *pgxpool.Pool
	log     *slog.Logger
	metrics *Metrics
	buf     chan owned.RunRecord
	dropped atomic.Int64

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

var _ owned.RunHistory = (*HistoryWriter)(nil)

// NewHistoryWriter returns a started writer; buffer <= 0 is
// DefaultHistoryBuffer. Stop it to flush.
func NewHistoryWriter(pool *pgxpool.Pool, buffer int, log *slog.Logger, m *Metrics) *HistoryWriter {
	if buffer <= 0 {
		buffer = DefaultHistoryBuffer
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &HistoryWriter{pool: pool, log: log, metrics: m, buf: make(chan owned.RunRecord, buffer),
		stop: make(chan struct{}), done: make(chan struct{})}
	go w.loop()
	return w
}

// RunEnded implements owned.RunHistory.
func (w *HistoryWriter) RunEnded(rec owned.RunRecord) {
	select {
	case w.buf <- rec:
	default:
		if n := w.dropped.Add(1); n&(n-1) == 0 { // log the 1st, 2nd, 4th, 8th ... drop
			w.log.Warn("run_history_dropped", "job", rec.Job, "lock_key", rec.Key, "dropped", n,
				"detail", "the run history buffer is full: Postgres has not taken records for a while")
		}
		w.metrics.drop("run_history", 1)
	}
}

// Dropped is how many records did not fit the buffer.
func (w *HistoryWriter) Dropped() int64 { return w.dropped.Load() }

// Stop writes what is buffered, within ctx, then returns. Safe twice.
func (w *HistoryWriter) Stop(ctx context.Context) {
	w.stopOnce.Do(func() { close(w.stop) })
	select {
	case <-w.done:
	case <-ctx.Done():
	}
}

func (w *HistoryWriter) loop() {
	defer close(w.done)
	var batch []owned.RunRecord
	wait := retryFirst
	for {
		if len(batch) == 0 {
			select {
			case rec := <-w.buf:
				batch = append(batch, rec)
			case <-w.stop:
				w.final()
				return
			}
		}
	drain:
		for len(batch) < historyBatch {
			select {
			case rec := <-w.buf:
				batch = append(batch, rec)
			default:
				break drain
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rest, err := w.write(ctx, batch)
		cancel()
		if err == nil {
			batch, wait = batch[:0], retryFirst
			continue
		}
		batch = rest
		w.metrics.failed("run_history")
		w.log.Warn("run_history_write_failed", "records", len(batch), "retry_in_ms", wait.Milliseconds(), "error", err)
		select {
		case <-time.After(wait):
			wait = min(2*wait, retryMax)
		case <-w.stop:
			w.drain(batch)
			w.final()
			return
		}
	}
}

// write stores batch in one round trip. When Postgres refuses it for
// what a record holds (a constraint, a NUL: sending it again cannot
// succeed), the records are written one by one and only the refused ones
// are dropped, counted and logged: one bad record never costs the others,
// nor blocks the records behind it. Any other error returns the records
// not yet written, to retry.
func (w *HistoryWriter) write(ctx context.Context, batch []owned.RunRecord) (rest []owned.RunRecord, err error) {
	err = insertRuns(ctx, w.pool, batch)
	if err == nil {
		return nil, nil
	}
	if !refused(err) {
		return batch, err
	}
	for i, r := range batch {
		err := insertRuns(ctx, w.pool, batch[i:i+1])
		switch {
		case err == nil:
		case refused(err):
			w.metrics.drop("run_history", 1)
			w.log.Error("run_history_write_refused", "job", r.Job, "lock_key", r.Key, "error", err)
		default:
			return batch[i:], err
		}
	}
	return nil, nil
}

// drain puts batch back ahead of the buffer's content for the final write.
func (w *HistoryWriter) drain(batch []owned.RunRecord) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if rest, err := w.write(ctx, batch); err != nil {
		w.metrics.drop("run_history", len(rest))
		w.log.Warn("run_history_dropped_at_stop", "records", len(rest), "error", err)
	}
}

// final writes what is left in the buffer once, at stop.
func (w *HistoryWriter) final() {
	var batch []owned.RunRecord
	for len(w.buf) > 0 {
		batch = append(batch, <-w.buf)
	}
	if len(batch) > 0 {
		w.drain(batch)
	}
}

const sqlInsertRun = `
insert into run_history (job, run_key, outcome, replica, fence, lock_fence, trigger_source, request_id,
                         requested_by, principal, started_at, ended_at, counts, error, timeline)
values ($1, $2, $3, $4, nullif($5::bigint, 0), nullif($6::bigint, 0), nullif($7, ''), nullif($8, ''), nullif($9, ''), nullif($10, ''),
        $11, $12, $13, nullif($14, ''), $15)`

// insertRuns writes records in one round trip (a pipelined batch, one
// implicit transaction).
func insertRuns(ctx context.Context, pool *pgxpool.Pool, recs []owned.RunRecord) error {
	if len(recs) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for _, r := range recs {
		counts := r.Counts
		if counts == nil {
			counts = map[string]int64{}
		}
		cj, err := json.Marshal(counts)
		if err != nil {
			return fmt.Errorf("counts: %w", err)
		}
		tl := make([][3]int64, len(r.Timeline))
		for i, p := range r.Timeline {
			tl[i] = [3]int64{p.At.Milliseconds(), p.Batches, p.Rows}
		}
		tj, err := json.Marshal(tl)
		if err != nil {
			return fmt.Errorf("timeline: %w", err)
		}
		started := r.Started
		if started.IsZero() {
			started = r.Ended
		}
		b.Queue(sqlInsertRun, r.Job, r.Key, string(r.Outcome), r.Replica, r.Fence, r.LockFence, string(r.Trigger.Source),
			r.Trigger.RequestID, r.Trigger.RequestedBy, r.Trigger.Principal, started, r.Ended, cj, r.Error, tj)
	}
	res := pool.SendBatch(ctx, b)
	var err error
	for range recs {
		if _, e := res.Exec(); e != nil {
			err = errors.Join(err, e)
			break
		}
	}
	return errors.Join(err, res.Close())
}

// refused says Postgres answered err for what was sent (a SQLSTATE that is
// not a connection, resource or concurrency fault): sending it again
// cannot succeed.
func refused(err error) bool { return postgres.Code(err) != "" && !postgres.IsTransient(err) }

package demo

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/migrate"
	"github.com/telco-platform/coordinator/internal/msisdnreaper"
	"github.com/telco-platform/coordinator/internal/replica"
)

// The demo's steps and checks (Run, in demo.go, puts them in order).

func ids(reps []*replica.Replica) string {
	var s []string
	for _, r := range reps {
		s = append(s, r.ID())
	}
	return strings.Join(s, ", ")
}

func httpAddrs(reps []*replica.Replica) string {
	var s []string
	for _, r := range reps {
		if a := r.HTTPAddr(); a != nil {
			s = append(s, a.String())
		}
	}
	return strings.Join(s, ", ")
}

func answeredLine(m map[string]int) string {
	var parts []string
	for _, src := range []string{"kafka", "http", "cron", "cli"} {
		if m[src] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", src, m[src]))
		}
	}
	return strings.Join(parts, ", ")
}

// prepare migrates and seeds; it returns the number of ACTIVE subscribers.
func prepare(ctx context.Context, pool *pgxpool.Pool, cfg Config, period billrun.Period) (int64, error) {
	m, err := migrate.New(pool)
	if err != nil {
		return 0, err
	}
	defer m.Close()
	if _, err := m.Up(ctx); err != nil {
		return 0, err
	}
	if cfg.batchPause > 0 {
		if _, err := pool.Exec(ctx, fmt.Sprintf(sqlPauseBatches, cfg.batchPause.Seconds())); err != nil {
			return 0, fmt.Errorf("demo: pause batches: %w", err)
		}
	}
	res, err := billrun.Seed(ctx, pool, billrun.SeedConfig{Subscribers: cfg.Subscribers, FirstID: 1,
		SuspendedRatio: 0.05, TerminatedRatio: 0.02, Usage: true, Period: period})
	if err != nil {
		return 0, err
	}
	if cfg.StaleReservations > 0 {
		if _, err := msisdnreaper.Seed(ctx, pool, msisdnreaper.SeedSpec{StaleReserved: cfg.StaleReservations,
			ValidReserved: cfg.StaleReservations / 10, Allocated: cfg.StaleReservations / 2,
			Free: cfg.StaleReservations - cfg.StaleReservations/10 - cfg.StaleReservations/2}); err != nil {
			return 0, err
		}
	}
	return res.Active, nil
}

// sqlPauseBatches makes each bill-run batch transaction sleep (%f seconds)
// as it records its batch (Config.batchPause).
const sqlPauseBatches = `
create function demo_pause_batch() returns trigger language plpgsql as $$
begin perform pg_sleep(%f); return new; end $$;
create trigger demo_pause_batch before insert on bill_run_batches for each row execute function demo_pause_batch()`

type checked struct {
	status, owner        string
	fence                int64
	invoices, duplicates int64
	staleLeft            int64
}

const (
	sqlBillRun   = `select status, coalesce(owner, ''), fence from bill_runs where period = $1`
	sqlInvoices  = `select count(*), count(*) - count(distinct subscriber_id) from invoices where period = $1`
	sqlStaleLeft = `select count(*) from msisdn_pool where state = 'RESERVED' and reserved_until < now()`
)

func verify(ctx context.Context, pool *pgxpool.Pool, p billrun.Period) (checked, error) {
	var c checked
	if err := pool.QueryRow(ctx, sqlBillRun, p.String()).Scan(&c.status, &c.owner, &c.fence); err != nil {
		return c, fmt.Errorf("%w: read bill_runs %s: %v", ErrCheckFailed, p, err)
	}
	if err := pool.QueryRow(ctx, sqlInvoices, p.String()).Scan(&c.invoices, &c.duplicates); err != nil {
		return c, fmt.Errorf("demo: count invoices: %w", err)
	}
	if err := pool.QueryRow(ctx, sqlStaleLeft).Scan(&c.staleLeft); err != nil {
		return c, fmt.Errorf("demo: count stale reservations: %w", err)
	}
	return c, nil
}

// produceTrigger sends the contract's bill-run trigger record; "" on success.
func produceTrigger(ctx context.Context, brokers []string, topic, period string) string {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ClientID("coordinator-demo-producer"))
	if err != nil {
		return err.Error()
	}
	defer cl.Close()
	v, _ := json.Marshal(map[string]string{"period": period, "request_id": "demo-kafka-" + randomHex(4), "requested_by": "coordinator-demo"})
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(period), Value: v}).FirstErr(); err != nil {
		return err.Error()
	}
	return ""
}

// postTrigger calls POST /v1/billruns on r and describes the answer.
func postTrigger(ctx context.Context, r *replica.Replica, token, period string) string {
	addr := r.HTTPAddr()
	if addr == nil {
		return "HTTP: replica has no listener"
	}
	body, _ := json.Marshal(map[string]string{"period": period})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr.String()+"/v1/billruns", bytes.NewReader(body))
	if err != nil {
		return "HTTP: " + err.Error()
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", "demo-http-"+randomHex(4))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "HTTP: " + err.Error()
	}
	defer resp.Body.Close()
	var answer map[string]any
	_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&answer)
	detail := ""
	for _, k := range []string{"outcome", "owner", "fence", "reason", "code"} {
		if v, ok := answer[k]; ok {
			detail += fmt.Sprintf(" %s=%v", k, v)
		}
	}
	return fmt.Sprintf("HTTP POST /v1/billruns to %s answered %d%s", r.ID(), resp.StatusCode, detail)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// syncWriter serialises writes from the replicas' loggers.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// cronAt is a cron spec (with seconds) that fires at t, to the second.
func cronAt(t time.Time) string {
	t = t.UTC()
	return fmt.Sprintf("CRON_TZ=UTC %d %d %d %d %d *", t.Second(), t.Minute(), t.Hour(), t.Day(), int(t.Month()))
}

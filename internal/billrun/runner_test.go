package billrun_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// period is the latest closed month (UTC, the default billing zone).
var period = billrun.PeriodOf(time.Now().UTC()).Previous()

// bundle is one test's world: its own schema, a memory locker and an event recorder.
type bundle struct {
	pool   *pgxpool.Pool
	locker *ownership.MemoryLocker
	rec    *events.Recorder
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pg := testenv.Postgres(t)
	// Renewed every second: a lease a run needs is lost only if renewal stalls
	// for ~2s, which a busy machine does not do (600ms TTLs lost it at ~370ms).
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a", WaitTime: 50 * time.Millisecond, WatchdogTimeout: 3 * time.Second})
	t.Cleanup(func() { _ = l.Close() })
	return &bundle{pool: pg.Pool, locker: l, rec: &events.Recorder{}}
}

// runner runs the bill-run kind through the owned template, as a replica
// does, with the locker's owner as the replica id.
type runner struct {
	template *owned.Runner
	kind     owned.Kind
	pool     *pgxpool.Pool
}

func (r runner) Run(ctx context.Context, p billrun.Period, t job.Trigger) job.Result {
	return r.template.Run(ctx, r.kind, params(r.kind, billrun.Request{Period: p}), t)
}

func (r runner) Claim(ctx context.Context, p billrun.Period, t job.Trigger) (*owned.Owned, job.Result) {
	return r.template.Begin(ctx, r.kind, params(r.kind, billrun.Request{Period: p}), t)
}

// params are the Params of a bill run of k asking for r.
func params(k owned.Kind, r billrun.Request) owned.Params {
	p, err := owned.NewParams(k, r)
	if err != nil {
		panic(err)
	}
	return p
}

func (r runner) Status(ctx context.Context, p billrun.Period) (billrun.Status, error) {
	return billrun.ReadStatus(ctx, r.pool, p)
}

func (b *bundle) runner(cfg billrun.Config) runner {
	return b.runnerWith(b.locker, "", cfg)
}

// runnerWith uses l; replica "" is l's owner.
func (b *bundle) runnerWith(l ownership.Locker, replica string, cfg billrun.Config) runner {
	if cfg.BatchSize == 0 {
		cfg.BatchSize = 25
	}
	if cfg.RetryBackoff == 0 {
		cfg.RetryBackoff = 10 * time.Millisecond
	}
	return newRunner(b.pool, l, replica, b.rec, cfg)
}

func newRunner(pool *pgxpool.Pool, l ownership.Locker, replica string, emit events.Emitter, cfg billrun.Config) runner {
	k := billrun.New(cfg)
	reg, err := owned.NewRegistry(k)
	if err != nil {
		panic(err)
	}
	// cfg.Logger also gets the template's lines (a run's retries among them).
	r, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{DB: pool, Locker: l, Log: cfg.Logger}, Replica: replica, Emit: emit})
	if err != nil {
		panic(err)
	}
	return runner{template: r, kind: k, pool: pool}
}

func (b *bundle) seed(t *testing.T, cfg billrun.SeedConfig) billrun.SeedResult {
	t.Helper()
	if !cfg.Period.Valid() {
		cfg.Period = period
	}
	res, err := billrun.Seed(context.Background(), b.pool, cfg)
	require.NoError(t, err)
	return res
}

func (b *bundle) count(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, b.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// requireExactlyOnce checks every ACTIVE subscriber has exactly one invoice
// for the period and nobody else has one.
func (b *bundle) requireExactlyOnce(t *testing.T, p billrun.Period) {
	t.Helper()
	active := b.count(t, `select count(*) from subscribers where status = 'ACTIVE'`)
	require.Equal(t, active, b.count(t, `select count(*) from invoices where period = $1`, p.String()), "one invoice per ACTIVE subscriber")
	require.Equal(t, int64(0), b.count(t, `
		select count(*) from subscribers s
		where s.status = 'ACTIVE' and (select count(*) from invoices i where i.subscriber_id = s.id and i.period = $1) <> 1`, p.String()))
	require.Equal(t, int64(0), b.count(t, `
		select count(*) from invoices i join subscribers s on s.id = i.subscriber_id
		where i.period = $1 and s.status <> 'ACTIVE'`, p.String()), "no SUSPENDED or TERMINATED subscriber is invoiced")
}

func trig() job.Trigger { return job.Trigger{Source: job.SourceCLI, RequestID: events.NewID()} }

func types(evs []events.Event) []events.Type {
	out := make([]events.Type, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

func TestRunBillsActiveSubscribersWithUsage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seeded := b.seed(t, billrun.SeedConfig{Subscribers: 300, SuspendedRatio: 0.2, TerminatedRatio: 0.1, Usage: true})
	require.Positive(t, seeded.Suspended)
	require.Positive(t, seeded.Terminated)
	require.Positive(t, seeded.UsageCharges)
	// Usage of another period must not be billed.
	_, err := b.pool.Exec(context.Background(), `insert into usage_charges (subscriber_id, period, amount_cents) select id, $1, 100000 from subscribers`, period.Previous().String())
	require.NoError(t, err)

	tr := trig()
	res := b.runner(billrun.Config{Workers: 3}).Run(context.Background(), period, tr)
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, "billrun", res.Job)
	require.Equal(t, billrun.LockKey(period), res.Key)
	require.Equal(t, "replica-a", res.Replica)
	require.Equal(t, "replica-a", res.Owner)
	require.Equal(t, int64(1), res.Fence)
	require.Equal(t, tr.RequestID, res.RequestID)
	require.Equal(t, seeded.Active, res.Counts["subscribers"])
	require.Equal(t, seeded.Active, res.Counts["invoices_created"])
	require.Equal(t, int64(0), res.Counts["already_invoiced"])
	wantBatches := (seeded.Active + 24) / 25
	require.Equal(t, wantBatches, res.Counts["batches_total"])
	require.Equal(t, wantBatches, res.Counts["batches_committed"])
	require.Equal(t, int64(0), res.Counts["batches_skipped"])
	b.requireExactlyOnce(t, period)

	// amount = monthly fee + this period's usage, for every invoice.
	require.Equal(t, int64(0), b.count(t, `
		select count(*) from invoices i join subscribers s on s.id = i.subscriber_id
		where i.period = $1 and i.amount_cents <> s.monthly_fee_cents +
		      coalesce((select sum(u.amount_cents) from usage_charges u where u.subscriber_id = s.id and u.period = $1), 0)`, period.String()))
	require.Positive(t, b.count(t, `
		select count(*) from invoices i join subscribers s on s.id = i.subscriber_id
		where i.period = $1 and i.amount_cents > s.monthly_fee_cents`, period.String()), "some invoices carry usage")

	st, err := b.runner(billrun.Config{}).Status(context.Background(), period)
	require.NoError(t, err)
	require.Equal(t, billrun.StatusCompleted, st.Status)
	require.Equal(t, "replica-a", st.Owner)
	require.Equal(t, int64(1), st.Fence)
	require.Equal(t, seeded.Active, st.Counts["invoices_created"])
	require.Equal(t, wantBatches, st.Counts["batches_committed"])
	require.NotNil(t, st.StartedAt)
	require.NotNil(t, st.FinishedAt)
	require.Empty(t, st.LastError)

	require.Equal(t, []events.Type{events.OwnershipAcquired, events.RunCompleted, events.OwnershipReleased}, types(b.rec.Events()))
	done := b.rec.OfType(events.RunCompleted)[0]
	require.Equal(t, billrun.LockKey(period), done.Key)
	require.Equal(t, "cli", done.Trigger)
	require.Equal(t, tr.RequestID, done.RequestID)
	require.Equal(t, int64(1), done.Fence)
	require.Equal(t, seeded.Active, done.Extra["invoices_created"])
	locks, err := b.locker.Locks(context.Background())
	require.NoError(t, err)
	require.Empty(t, locks, "the lock is released")
}

// The claim records who asked: requested_by and principal of the trigger,
// its request id and source, in bill_runs and in GET status; a later claim
// of an unfinished period records its own requester.
func TestClaimRecordsWhoAsked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 60})
	r := b.runner(billrun.Config{})
	ctx := context.Background()
	byAlice := job.Trigger{Source: job.SourceHTTP, RequestID: "req-alice", RequestedBy: "alice", Principal: "billing-ops"}
	require.Equal(t, job.OutcomeCompleted, r.Run(ctx, period, byAlice).Outcome)
	row := func() [4]*string {
		var v [4]*string
		require.NoError(t, b.pool.QueryRow(ctx, `select requested_by, principal, request_id, trigger_source from bill_runs where period = $1`,
			period.String()).Scan(&v[0], &v[1], &v[2], &v[3]))
		return v
	}
	str := func(s string) *string { return &s }
	require.Equal(t, [4]*string{str("alice"), str("billing-ops"), str("req-alice"), str("http")}, row())
	st, err := r.Status(ctx, period)
	require.NoError(t, err)
	require.Equal(t, []string{"alice", "billing-ops", "req-alice", "http"}, []string{st.RequestedBy, st.Principal, st.RequestID, st.Trigger})
	for _, e := range b.rec.Events() {
		require.Equal(t, "alice", e.RequestedBy, e.Type)
		require.Equal(t, "billing-ops", e.Principal, e.Type)
	}

	// Unfinished again (as after a failure): the next claim is a Kafka
	// trigger's, with no principal; NULL, not an empty string.
	_, err = b.pool.Exec(ctx, `update bill_runs set status = 'FAILED' where period = $1`, period.String())
	require.NoError(t, err)
	byKafka := job.Trigger{Source: job.SourceKafka, RequestID: "req-kafka", RequestedBy: "subscription-service"}
	require.Equal(t, job.OutcomeCompleted, r.Run(ctx, period, byKafka).Outcome)
	require.Equal(t, [4]*string{str("subscription-service"), nil, str("req-kafka"), str("kafka")}, row())
}

func TestStatusNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.runner(billrun.Config{}).Status(context.Background(), period)
	require.ErrorIs(t, err, billrun.ErrNotFound)
}

func TestRerunAfterCompletionWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 120, SuspendedRatio: 0.1})
	r := b.runner(billrun.Config{})
	require.Equal(t, job.OutcomeCompleted, r.Run(context.Background(), period, trig()).Outcome)
	snapshot := func() [4]int64 {
		return [4]int64{
			b.count(t, `select count(*) from invoices`),
			b.count(t, `select coalesce(max(id), 0) from invoices`),
			b.count(t, `select count(*) from bill_run_batches`),
			b.count(t, `select fence * 1000 + attempts from bill_runs`),
		}
	}
	before := snapshot()
	b.rec = &events.Recorder{}
	logs := newLines()
	res := b.runner(billrun.Config{Logger: slog.New(slog.NewJSONHandler(logs, nil))}).Run(context.Background(), period, trig())
	require.Equal(t, job.OutcomeAlreadyCompleted, res.Outcome, res.Error)
	logs.mu.Lock()
	for _, l := range logs.all {
		require.NotEqual(t, "billrun_retry", l["msg"], "finding the period COMPLETED is an answer, not a fault to retry: %v", l)
	}
	logs.mu.Unlock()
	require.Equal(t, 0, res.Outcome.ExitCode())
	require.Equal(t, int64(1), res.Fence)
	require.Equal(t, before, snapshot(), "an already completed run writes nothing")
	// Answered before the lock (issue 28): nothing acquired, nothing released.
	require.Equal(t, []events.Type{events.RunAlreadyCompleted}, types(b.rec.Events()))
	done := b.rec.OfType(events.RunAlreadyCompleted)[0]
	require.Equal(t, before[0], done.Extra["period_invoices_created"])
	require.Equal(t, true, done.Extra[owned.DataBeforeLock])
}

func TestPreexistingInvoicesAreReportedAsAlreadyInvoiced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 200, SuspendedRatio: 0.25})
	// 17 ACTIVE subscribers were invoiced by someone else (the old service).
	_, err := b.pool.Exec(context.Background(), `
		insert into invoices (subscriber_id, period, amount_cents)
		select id, $1, 1 from subscribers where status = 'ACTIVE' order by id desc limit 17`, period.String())
	require.NoError(t, err)
	res := b.runner(billrun.Config{ConflictSample: 5}).Run(context.Background(), period, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	active := b.count(t, `select count(*) from subscribers where status = 'ACTIVE'`)
	require.Equal(t, int64(17), res.Counts["already_invoiced"])
	require.Equal(t, active-17, res.Counts["invoices_created"])
	require.Equal(t, active, res.Counts["subscribers"])
	b.requireExactlyOnce(t, period)
	require.Equal(t, int64(17), b.count(t, `select count(*) from invoices where period = $1 and amount_cents = 1`, period.String()), "existing invoices are untouched")

	conflicts := b.rec.OfType(events.BillrunInvoiceConflict)
	require.Len(t, conflicts, 1)
	require.Equal(t, int64(17), conflicts[0].Extra["already_invoiced"])
	sample := conflicts[0].Extra["sample"].([]int64)
	require.Len(t, sample, 5)
	for _, id := range sample {
		require.Equal(t, int64(1), b.count(t, `select count(*) from invoices where subscriber_id = $1 and period = $2 and amount_cents = 1`, id, period.String()), "sample id %d was pre-invoiced", id)
	}
	st, err := b.runner(billrun.Config{}).Status(context.Background(), period)
	require.NoError(t, err)
	require.Equal(t, int64(17), st.Counts["already_invoiced"])
}

func TestConcurrentRunnersOneOwner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 400, TerminatedRatio: 0.2})
	var wg sync.WaitGroup
	results := make([]job.Result, 3)
	for i := range results {
		r := b.runnerWith(b.locker, fmt.Sprintf("replica-%d", i), billrun.Config{BatchSize: 10})
		wg.Go(func() { results[i] = r.Run(context.Background(), period, trig()) })
	}
	wg.Wait()
	byOutcome := map[job.Outcome]int{}
	for _, r := range results {
		byOutcome[r.Outcome]++
		require.Contains(t, []job.Outcome{job.OutcomeCompleted, job.OutcomeAlreadyOwned, job.OutcomeAlreadyCompleted}, r.Outcome, r.Error)
		if r.Outcome == job.OutcomeAlreadyOwned {
			require.Equal(t, "replica-a", r.Owner, "already_owned names the lock owner")
		}
	}
	require.Equal(t, 1, byOutcome[job.OutcomeCompleted], "%+v", results)
	b.requireExactlyOnce(t, period)
	require.Len(t, b.rec.OfType(events.RunCompleted), 1)
	require.Len(t, b.rec.OfType(events.OwnershipAlreadyOwned), byOutcome[job.OutcomeAlreadyOwned])
}

func TestAlreadyOwnedAndUnavailableRunNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 20})
	held, err := b.locker.Acquire(context.Background(), billrun.LockKey(period), 0)
	require.NoError(t, err)
	res := b.runner(billrun.Config{}).Run(context.Background(), period, trig())
	require.Equal(t, job.OutcomeAlreadyOwned, res.Outcome)
	require.Equal(t, job.ExitAlreadyOwned, res.Outcome.ExitCode())
	require.Equal(t, "replica-a", res.Owner)
	ev := b.rec.OfType(events.OwnershipAlreadyOwned)
	require.Len(t, ev, 1)
	require.Equal(t, "replica-a", ev[0].Owner)
	require.NoError(t, held.Release(context.Background()))

	b.locker.SetUnavailable(true)
	res = b.runner(billrun.Config{}).Run(context.Background(), period, trig())
	require.Equal(t, job.OutcomeUnavailable, res.Outcome)
	require.Equal(t, job.ExitUnavailable, res.Outcome.ExitCode())
	require.Len(t, b.rec.OfType(events.OwnershipUnavailable), 1)
	require.Equal(t, int64(0), b.count(t, `select count(*) from bill_runs`), "nothing ran")
	require.Equal(t, int64(0), b.count(t, `select count(*) from invoices`))
}

// stopAfter returns a BeforeBatch hook that calls fn once, when batch n+1 is
// about to start, and then waits for the run's context to end.
func stopAfter(n int64, fn func()) func(ctx context.Context, first, last int64) error {
	var started atomic.Int64
	return func(ctx context.Context, first, last int64) error {
		if started.Add(1) <= n {
			return nil
		}
		if started.Load() == n+1 {
			fn()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Second):
			return errors.New("test: the run was not stopped")
		}
	}
}

func TestLeaseLossInterruptsAndANewRunResumes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 500, SuspendedRatio: 0.1})
	key := billrun.LockKey(period)
	r := b.runner(billrun.WithBeforeBatch(billrun.Config{Workers: 1}, stopAfter(3, func() { b.locker.DeleteLock(key) })))
	res := r.Run(context.Background(), period, trig())
	require.Equal(t, job.OutcomeLost, res.Outcome, res.Error)
	require.Equal(t, job.ExitLost, res.Outcome.ExitCode())
	require.Equal(t, int64(3), res.Counts["batches_committed"])
	lost := b.rec.OfType(events.OwnershipLost)
	require.Len(t, lost, 1)
	require.Equal(t, billrun.ReasonLeaseLost, lost[0].Extra["reason"])
	st, err := r.Status(context.Background(), period)
	require.NoError(t, err)
	require.Equal(t, billrun.StatusInterrupted, st.Status)
	require.Equal(t, int64(3), st.Counts["batches_committed"])
	require.Equal(t, int64(3), b.count(t, `select count(*) from bill_run_batches`))

	res = b.runner(billrun.Config{}).Run(context.Background(), period, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(2), res.Fence)
	require.Equal(t, int64(3), res.Counts["batches_skipped"])
	require.Equal(t, res.Counts["batches_total"], res.Counts["batches_skipped"]+res.Counts["batches_committed"])
	require.Equal(t, int64(0), res.Counts["already_invoiced"], "resume re-bills nobody")
	b.requireExactlyOnce(t, period)
}

func TestShutdownInterruptsAndReleases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 200})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := b.runner(billrun.WithBeforeBatch(billrun.Config{Workers: 2}, stopAfter(2, cancel)))
	c, res := r.Claim(ctx, period, trig())
	require.NotNil(t, c, res.Error)
	require.Equal(t, int64(1), c.Fence())
	res = c.Execute(ctx)
	require.Equal(t, job.OutcomeLost, res.Outcome, res.Error)
	lost := b.rec.OfType(events.OwnershipLost)
	require.Len(t, lost, 1)
	require.Equal(t, billrun.ReasonShutdown, lost[0].Extra["reason"])
	st, err := r.Status(context.Background(), period)
	require.NoError(t, err)
	require.Equal(t, billrun.StatusInterrupted, st.Status)
	require.Contains(t, st.LastError, "shutdown")
	locks, err := b.locker.Locks(context.Background())
	require.NoError(t, err)
	require.Empty(t, locks, "shutdown releases the lock")
	require.Equal(t, job.OutcomeFailed, c.Execute(context.Background()).Outcome, "Execute runs once")
}

// A claim whose fence was superseded (its process paused, another replica
// claimed) cannot commit a single batch.
func TestStaleFenceCannotCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 100})
	stale, res := b.runner(billrun.Config{}).Claim(context.Background(), period, trig())
	require.NotNil(t, stale, res.Error)

	// Another process (its own locker: the stale one's Redis lease expired).
	other := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-b"})
	defer other.Close()
	fresh, res := b.runnerWith(other, "", billrun.Config{}).Claim(context.Background(), period, trig())
	require.NotNil(t, fresh, res.Error)
	require.Equal(t, int64(2), fresh.Fence())

	res = stale.Execute(context.Background())
	require.Equal(t, job.OutcomeLost, res.Outcome, res.Error)
	require.Equal(t, int64(0), res.Counts["batches_committed"])
	require.Equal(t, billrun.ReasonFenceLost, b.rec.OfType(events.OwnershipLost)[0].Extra["reason"])
	require.Equal(t, int64(0), b.count(t, `select count(*) from invoices`))
	require.Equal(t, int64(0), b.count(t, `select count(*) from bill_run_batches`))
	st, err := b.runner(billrun.Config{}).Status(context.Background(), period)
	require.NoError(t, err)
	require.Equal(t, billrun.StatusRunning, st.Status, "the stale owner does not touch the new claim")
	require.Equal(t, "replica-b", st.Owner)

	res = fresh.Execute(context.Background())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	b.requireExactlyOnce(t, period)
	require.Equal(t, int64(0), b.count(t, `select count(*) from bill_run_batches where fence <> 2`))
}

// An identity collision raises 23505 on invoices_pkey, which ON CONFLICT
// (subscriber_id, period) does not cover: it is reported as an invoice
// conflict and the batch is retried with fresh ids.
func TestEscapedUniqueViolationIsReportedAndRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 60})
	_, err := b.pool.Exec(context.Background(), `insert into invoices (id, subscriber_id, period, amount_cents) values (5, 999999, '2001-01', 1)`)
	require.NoError(t, err)
	res := b.runner(billrun.Config{Workers: 1}).Run(context.Background(), period, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(1), res.Counts["unique_violations"])
	require.Equal(t, int64(1), res.Counts["batches_retried"])
	conflicts := b.rec.OfType(events.BillrunInvoiceConflict)
	require.Len(t, conflicts, 1)
	require.Equal(t, "23505", conflicts[0].Extra["sqlstate"])
	require.Equal(t, "invoices_pkey", conflicts[0].Extra["constraint"])
	b.requireExactlyOnce(t, period)
}

func TestPersistentUniqueViolationFailsTheRunByName(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 60})
	// A rule of another writer that every batch breaks.
	_, err := b.pool.Exec(context.Background(), `create unique index uidx_test_one_amount on invoices (period, amount_cents)`)
	require.NoError(t, err)
	res := b.runner(billrun.Config{Workers: 1, MaxBatchAttempts: 3}).Run(context.Background(), period, trig())
	require.Equal(t, job.OutcomeFailed, res.Outcome)
	require.Equal(t, job.ExitFailed, res.Outcome.ExitCode())
	require.Contains(t, res.Error, "unique violation (SQLSTATE 23505) on uidx_test_one_amount")
	require.Equal(t, int64(3), res.Counts["unique_violations"])
	require.Len(t, b.rec.OfType(events.BillrunInvoiceConflict), 3)
	failed := b.rec.OfType(events.RunFailed)
	require.Len(t, failed, 1)
	require.Contains(t, failed[0].Extra["error"], "uidx_test_one_amount")
	st, err := b.runner(billrun.Config{}).Status(context.Background(), period)
	require.NoError(t, err)
	require.Equal(t, billrun.StatusFailed, st.Status)
	require.Contains(t, st.LastError, "23505")
}

package migrate_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/migrate"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func tables(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`select table_name from information_schema.tables where table_schema = current_schema() and table_name <> 'goose_db_version' order by 1`)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		out = append(out, n)
	}
	require.NoError(t, rows.Err())
	return out
}

func TestUpIsIdempotentAndDownReverses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.PostgresEmpty(t)
	m, err := migrate.New(pg.Pool)
	require.NoError(t, err)
	defer m.Close()

	pending, err := m.Pending(ctx)
	require.NoError(t, err)
	require.Positive(t, pending)

	applied, err := m.Up(ctx)
	require.NoError(t, err)
	require.Len(t, applied, pending)
	require.Equal(t, []string{"bill_run_adjustments", "bill_run_batches", "bill_run_changes", "bill_run_late", "bill_run_totals", "bill_runs", "console_sessions", "invoice_adjustments", "invoices", "msisdn_pool", "ownership_events", "replica_heartbeats", "run_history", "run_requests", "subscribers", "usage_charges"}, tables(t, pg.Pool))

	again, err := m.Up(ctx)
	require.NoError(t, err)
	require.Empty(t, again, "a second up must be a no-op")

	var idx string
	require.NoError(t, pg.Pool.QueryRow(ctx,
		`select indexdef from pg_indexes where schemaname = current_schema() and indexname = 'uidx_invoices_sub_period'`).Scan(&idx))
	require.Contains(t, idx, "UNIQUE")
	require.NoError(t, pg.Pool.QueryRow(ctx,
		`select indexdef from pg_indexes where schemaname = current_schema() and tablename = 'msisdn_pool' and indexdef like '%WHERE%RESERVED%'`).Scan(&idx))

	st, err := m.Status(ctx)
	require.NoError(t, err)
	for _, s := range st {
		require.True(t, s.Applied, "migration %d not applied", s.Version)
	}

	reverted, err := m.DownAll(ctx)
	require.NoError(t, err)
	require.Len(t, reverted, pending)
	require.Empty(t, tables(t, pg.Pool))

	// And forward again: down really reversed everything.
	_, err = m.Up(ctx)
	require.NoError(t, err)
	require.Len(t, tables(t, pg.Pool), 16)
}

func TestContractColumnsAcceptMinimalInserts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	// Other writers insert with the contract's named columns only; every extra column has a default.
	for _, q := range []string{
		`insert into subscribers (id, msisdn, status, monthly_fee_cents) values (1, '491700000001', 'ACTIVE', 1500)`,
		`insert into usage_charges (subscriber_id, period, amount_cents) values (1, '2026-11', 250)`,
		`insert into invoices (subscriber_id, period, amount_cents) values (1, '2026-11', 1750)`,
		`insert into bill_runs (period, status) values ('2026-11', 'RUNNING')`,
		`insert into msisdn_pool (msisdn, state) values ('491700000002', 'FREE')`,
		`insert into msisdn_pool (msisdn, state, reserved_until) values ('491700000003', 'RESERVED', now())`,
	} {
		_, err := pg.Pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	_, err := pg.Pool.Exec(ctx, `insert into invoices (subscriber_id, period, amount_cents) values (1, '2026-11', 1)`)
	require.Error(t, err, "uidx_invoices_sub_period must reject a second invoice")
	_, err = pg.Pool.Exec(ctx, `insert into subscribers (id, status, monthly_fee_cents) values (2, 'GONE', 1)`)
	require.Error(t, err, "status is constrained")
}

// Readiness asks Pending on every probe. A migration running meanwhile (on
// this schema or, since goose's lock is by default one advisory lock per
// database, on any other) must not make it wait: goose retries its lock
// every 5s, longer than a readiness check may take.
func TestPendingDoesNotWaitForTheMigrationLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.PostgresEmpty(t)
	// A lock id of this test's own, so holding it delays nobody else.
	const lockID int64 = 0x636f6f7264 // "coord"
	m, err := migrate.New(pg.Pool, migrate.WithLockID(lockID))
	require.NoError(t, err)
	defer m.Close()

	// Hold the migration lock the way a migrating replica does.
	conn, err := pg.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `select pg_advisory_lock($1)`, lockID)
	require.NoError(t, err)
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second) // below goose's 5s lock retry
	pending, err := m.Pending(pctx)
	cancel()
	require.NoError(t, err, "Pending waited for the migration lock")
	require.Positive(t, pending)
	// The lock is the one Up takes: it waits.
	uctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = m.Up(uctx)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "Up must take the migration lock")

	_, err = conn.Exec(ctx, `select pg_advisory_unlock($1)`, lockID)
	require.NoError(t, err)
	applied, err := m.Up(ctx)
	require.NoError(t, err)
	require.Len(t, applied, pending)
	pending, err = m.Pending(ctx)
	require.NoError(t, err)
	require.Zero(t, pending)
}

// 00014 adds bill_runs.completed_event_at: the rows already COMPLETED are
// taken as published (set to finished_at), so an upgrade does not make the
// resumers re-publish every run.completed; other rows stay NULL.
func TestCompletedEventAtIsSetForRowsCompletedBeforeIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.PostgresEmpty(t)
	m, err := migrate.New(pg.Pool)
	require.NoError(t, err)
	defer m.Close()
	_, err = m.UpTo(ctx, 13)
	require.NoError(t, err)
	_, err = pg.Pool.Exec(ctx, `insert into bill_runs (period, status, owner, fence, finished_at) values
		('2026-09', 'COMPLETED', 'r1', 1, '2026-10-01T03:00:00Z'),
		('2026-10', 'COMPLETED', 'r1', 2, null),
		('2026-11', 'RUNNING', 'r2', 1, null)`)
	require.NoError(t, err)
	applied, err := m.Up(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, applied)
	require.Equal(t, int64(14), applied[0].Version)

	got := map[string]*time.Time{}
	rows, err := pg.Pool.Query(ctx, `select period, completed_event_at from bill_runs`)
	require.NoError(t, err)
	for rows.Next() {
		var p string
		var at *time.Time
		require.NoError(t, rows.Scan(&p, &at))
		got[p] = at
	}
	require.NoError(t, rows.Err())
	require.NotNil(t, got["2026-09"])
	require.True(t, got["2026-09"].Equal(time.Date(2026, 10, 1, 3, 0, 0, 0, time.UTC)), "set to finished_at: %s", got["2026-09"])
	require.NotNil(t, got["2026-10"], "a COMPLETED row without finished_at is taken as published too")
	require.Nil(t, got["2026-11"], "a run not COMPLETED has no acknowledged run.completed")
}

// Rows that can never be right are refused where they enter (00017), with
// the constraint's name; rows that are right pass. (Before, each of the
// refused inserts was accepted: a 0-day invoice, a negative invoice, usage
// nobody billed.)
func TestBadDataIsRefusedNamingTheConstraint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.Postgres(t)
	for _, q := range []string{
		`insert into subscribers (id, status, monthly_fee_cents, activated_at, deactivated_at) values (1, 'ACTIVE', 1000, '2026-11-10', '2026-11-10')`,
		`insert into subscribers (id, status, monthly_fee_cents, activated_at) values (2, 'ACTIVE', 1000, '2026-11-10')`,
		`insert into subscribers (id, status, monthly_fee_cents, deactivated_at) values (3, 'TERMINATED', 1000, '2026-11-10')`,
		`insert into usage_charges (subscriber_id, period, amount_cents) values (1, '2026-11', 0)`,
	} {
		_, err := pg.Pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	for _, c := range []struct {
		sql, code, constraint string
	}{
		{`insert into subscribers (id, status, monthly_fee_cents, activated_at, deactivated_at) values (4, 'ACTIVE', 1000, '2026-11-10', '2026-11-09')`,
			"23514", "subscribers_deactivated_after_activated"},
		{`update subscribers set deactivated_at = '2026-11-01' where id = 2`, "23514", "subscribers_deactivated_after_activated"},
		{`insert into usage_charges (subscriber_id, period, amount_cents) values (1, '2026-11', -99000)`, "23514", "usage_charges_amount_non_negative"},
		{`insert into usage_charges (subscriber_id, period, amount_cents) values (404, '2026-11', 10)`, "23503", "usage_charges_subscriber_fk"},
		{`delete from subscribers where id = 1`, "23503", "usage_charges_subscriber_fk"},
	} {
		_, err := pg.Pool.Exec(ctx, c.sql)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, c.sql)
		require.Equal(t, c.code, pgErr.Code, c.sql)
		require.Equal(t, c.constraint, pgErr.ConstraintName, c.sql)
	}
}

// Rows already there that break a rule of 00017 stop it before anything
// changes, naming the rule, the count and the first ids; once they are
// corrected it applies.
func TestBadRowsStopTheConstraintsMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg := testenv.PostgresEmpty(t)
	m, err := migrate.New(pg.Pool)
	require.NoError(t, err)
	defer m.Close()
	_, err = m.UpTo(ctx, 16)
	require.NoError(t, err)
	_, err = pg.Pool.Exec(ctx, `
		insert into subscribers (id, status, monthly_fee_cents, activated_at, deactivated_at) values
		    (1, 'TERMINATED', 1000, '2026-11-10', '2026-11-01'), (2, 'ACTIVE', 1000, null, null), (3, 'TERMINATED', 1000, '2026-11-10', '2026-11-09');
		insert into usage_charges (id, subscriber_id, period, amount_cents) values (10, 2, '2026-11', -5), (11, 2, '2026-11', 5), (12, 99, '2026-11', 7)`)
	require.NoError(t, err)

	for _, step := range []struct {
		want []string
		fix  string
	}{
		{[]string{"2 subscriber(s) have deactivated_at before activated_at (ids 1, 3)", "subscribers_deactivated_after_activated"},
			`update subscribers set deactivated_at = null where id in (1, 3)`},
		{[]string{"1 usage_charges row(s) have a negative amount_cents (ids 10)", "usage_charges_amount_non_negative"},
			`delete from usage_charges where id = 10`},
		{[]string{"1 usage_charges row(s) belong to no subscriber (ids 12)", "usage_charges_subscriber_fk"},
			`insert into subscribers (id, status, monthly_fee_cents) values (99, 'ACTIVE', 0)`},
	} {
		_, err := m.Up(ctx)
		require.Error(t, err)
		for _, w := range step.want {
			require.Contains(t, err.Error(), w)
		}
		var n int
		require.NoError(t, pg.Pool.QueryRow(ctx, `select count(*) from pg_constraint where connamespace = current_schema()::regnamespace and conname in ('usage_charges_subscriber_fk', 'usage_charges_amount_non_negative', 'subscribers_deactivated_after_activated')`).Scan(&n))
		require.Zero(t, n, "nothing of 00017 is applied")
		_, err = pg.Pool.Exec(ctx, step.fix)
		require.NoError(t, err)
	}
	applied, err := m.Up(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(17), applied[0].Version)
}

package main

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// unmarkedDatabase creates a database of the test's own, without the
// disposable mark (a stand-in for production), and returns its DSN.
func unmarkedDatabase(t *testing.T) string {
	t.Helper()
	admin := testenv.PostgresEmpty(t).AdminDSN
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := postgres.Connect(ctx, admin, 1)
	require.NoError(t, err)
	defer pool.Close()
	name := testenv.UniqueName("prod")
	_, err = pool.Exec(ctx, "create database "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		p, err := postgres.Connect(ctx, admin, 1)
		if err != nil {
			return
		}
		defer p.Close()
		_, _ = p.Exec(ctx, "drop database "+pgx.Identifier{name}.Sanitize()+" with (force)")
	})
	u, err := url.Parse(admin)
	require.NoError(t, err)
	u.Path = "/" + name
	return u.String()
}

func TestSeedAndMigrateDownRefuseADatabaseNotMarkedDisposable(t *testing.T) {
	t.Parallel()
	dsn := unmarkedDatabase(t)
	env := map[string]string{"COORDINATOR_DATABASE_URL": dsn}

	code, _, errs := runCLI(t, env, "migrate", "up")
	require.Equal(t, 0, code, errs, "migrate up needs no mark")

	code, _, errs = runCLI(t, env, "seed", "--subscribers", "10")
	require.Equal(t, job.ExitUsage, code, errs)
	require.Contains(t, errs, "is not marked disposable")
	require.Contains(t, errs, "--force")
	code, _, errs = runCLI(t, env, "migrate", "down")
	require.Equal(t, job.ExitUsage, code, errs)
	require.Contains(t, errs, "migrate down would change its data or drop its tables")

	ctx := context.Background()
	pool, err := postgres.Connect(ctx, dsn, 1)
	require.NoError(t, err)
	defer pool.Close()
	var subscribers int
	require.NoError(t, pool.QueryRow(ctx, "select count(*) from subscribers").Scan(&subscribers))
	require.Zero(t, subscribers, "the refused seed wrote nothing")

	// --force goes ahead, with a warning; the flag may follow the verb.
	code, out, errs := runCLI(t, env, "seed", "--subscribers", "10", "--force")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, `"subscribers":10`)
	require.Contains(t, errs, "--force: database")
	code, out, errs = runCLI(t, env, "migrate", "down", "--force")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "reverted 00001_billing.sql")

	// Marked, neither needs --force.
	require.NoError(t, postgres.MarkDisposable(ctx, pool, "test"))
	ok, _, err := postgres.Disposable(ctx, pool)
	require.NoError(t, err)
	require.True(t, ok)
	code, _, errs = runCLI(t, env, "migrate", "up")
	require.Equal(t, 0, code, errs)
	code, _, errs = runCLI(t, env, "seed", "--subscribers", "5")
	require.Equal(t, 0, code, errs)
	code, _, errs = runCLI(t, env, "migrate", "down")
	require.Equal(t, 0, code, errs)
}

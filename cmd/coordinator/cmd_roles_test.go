package main

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// TestDocumentedRolesSeparateDDLFromDML runs docs/security.md's role and
// GRANT block (with names of the test's own), migrates as the owner role,
// and shows that the app role can do a replica's work and nothing
// destructive.
func TestDocumentedRolesSeparateDDLFromDML(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "security.md"))
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)<!-- pg-roles:begin -->\\s*```sql\\n(.*?)```\\s*<!-- pg-roles:end -->").FindSubmatch(b)
	require.NotNil(t, m, "docs/security.md: no SQL between the pg-roles markers")

	pg := testenv.PostgresEmpty(t) // its database is marked disposable
	owner, app, schema := testenv.UniqueName("owner"), testenv.UniqueName("app"), testenv.UniqueName("coord")
	block := strings.NewReplacer("coordinator_owner", owner, "coordinator_app", app).Replace(string(m[1]))
	block = regexp.MustCompile(`\bcoordinator\b`).ReplaceAllString(block, schema)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := postgres.Connect(ctx, pg.AdminDSN, 1)
	require.NoError(t, err)
	defer admin.Close()
	_, err = admin.Exec(ctx, block)
	require.NoError(t, err, block)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		a, err := postgres.Connect(ctx, pg.AdminDSN, 1)
		if err != nil {
			return
		}
		defer a.Close()
		_, _ = a.Exec(ctx, "drop schema if exists "+schema+" cascade")
		_, _ = a.Exec(ctx, "drop owned by "+owner+", "+app)
		_, _ = a.Exec(ctx, "drop role if exists "+owner)
		_, _ = a.Exec(ctx, "drop role if exists "+app)
	})

	as := func(role string) string {
		u, err := url.Parse(pg.AdminDSN)
		require.NoError(t, err)
		u.User = url.User(role) // the test cluster trusts loopback: no password
		dsn, err := testenv.WithSearchPath(u.String(), schema)
		require.NoError(t, err)
		return dsn
	}
	rd := testenv.Redis(t)
	env := func(role string) map[string]string {
		return map[string]string{"COORDINATOR_DATABASE_URL": as(role), "COORDINATOR_LOCK_REDIS_URL": rd.URL,
			"COORDINATOR_LOCK_KEY_PREFIX": rd.Prefix, "COORDINATOR_REPLICA_ID": role}
	}

	code, _, errs := runCLI(t, env(owner), "migrate", "up")
	require.Equal(t, 0, code, errs)
	code, _, errs = runCLI(t, env(owner), "seed", "--subscribers", "50")
	require.Equal(t, 0, code, errs)

	// The app role does a replica's work.
	code, out, errs := runCLI(t, env(app), "run", "billrun", "--period", billrun.PeriodOf(time.Now().UTC()).Previous().String())
	require.Equal(t, job.ExitOK, code, errs)
	var res job.Result
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, job.OutcomeCompleted, res.Outcome)
	require.EqualValues(t, 50, res.Counts["invoices_created"])
	code, _, errs = runCLI(t, env(app), "run", "reaper")
	require.Equal(t, job.ExitOK, code, errs)
	code, out, errs = runCLI(t, env(app), "migrate", "status")
	require.Equal(t, 0, code, errs)
	require.NotContains(t, out, "pending")

	// ... and nothing destructive, even on a disposable database.
	code, _, errs = runCLI(t, env(app), "migrate", "down")
	require.Equal(t, job.ExitFailed, code, errs)
	require.Contains(t, errs, "must be owner")
	code, _, errs = runCLI(t, env(app), "seed", "--reset", "--subscribers", "1")
	require.Equal(t, job.ExitFailed, code, errs)
	require.Contains(t, errs, "permission denied")
	var invoices int
	require.NoError(t, admin.QueryRow(ctx, "select count(*) from "+schema+".invoices").Scan(&invoices))
	require.Equal(t, 50, invoices, "nothing was dropped or truncated")
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func runCLI(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	cio := cliIO{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, getenv: func(k string) string { return env[k] }}
	code = dispatch(context.Background(), cio, args)
	return code, out.String(), errb.String()
}

func TestMigrateCommandRoundTrip(t *testing.T) {
	t.Parallel()
	pg := testenv.PostgresEmpty(t)
	env := map[string]string{"COORDINATOR_DATABASE_URL": pg.DSN}

	code, out, errs := runCLI(t, env, "migrate", "up")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "applied 00001_billing.sql")

	code, out, _ = runCLI(t, env, "migrate", "up")
	require.Equal(t, 0, code)
	require.Contains(t, out, "nothing to do")

	code, out, _ = runCLI(t, env, "migrate", "status")
	require.Equal(t, 0, code)
	require.NotContains(t, out, "pending")
	require.Contains(t, out, "00002_msisdn_pool.sql")

	// --json, like locks and watch: one array of the rows.
	code, out, errs = runCLI(t, env, "migrate", "status", "--json")
	require.Equal(t, 0, code, errs)
	var rows []struct {
		Version   int64  `json:"version"`
		Name      string `json:"name"`
		State     string `json:"state"`
		AppliedAt string `json:"applied_at"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
	require.NotEmpty(t, rows)
	for _, r := range rows {
		require.Equal(t, "applied", r.State, r.Name)
		require.NotEmpty(t, r.AppliedAt)
	}

	code, out, _ = runCLI(t, env, "migrate", "down")
	require.Equal(t, 0, code)
	require.Contains(t, out, "reverted 00001_billing.sql")

	code, out, _ = runCLI(t, env, "migrate", "status")
	require.Equal(t, 0, code)
	require.Contains(t, out, "pending")
}

func TestMigrateRejectsBadInputBeforeConnecting(t *testing.T) {
	t.Parallel()
	// A DSN nothing listens on: the config error must come before any dial.
	env := map[string]string{"COORDINATOR_DATABASE_URL": "postgres://u@127.0.0.1:1/x", "COORDINATOR_LOCK_WAIT_TIME": "banana"}
	code, _, errs := runCLI(t, env, "migrate", "up")
	require.Equal(t, job.ExitUsage, code)
	require.Contains(t, errs, "COORDINATOR_LOCK_WAIT_TIME")
	require.Contains(t, errs, "banana")

	code, _, errs = runCLI(t, map[string]string{}, "migrate", "up")
	require.Equal(t, job.ExitUsage, code)
	require.Contains(t, errs, "COORDINATOR_DATABASE_URL")

	code, _, errs = runCLI(t, map[string]string{"COORDINATOR_DATABASE_URL": "postgres://x@127.0.0.1/x"}, "migrate", "sideways")
	require.Equal(t, job.ExitUsage, code)
	require.Contains(t, errs, "usage")
}

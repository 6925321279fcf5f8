package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func TestSeedAndRunBillrun(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	env := func(replica string) map[string]string {
		return map[string]string{
			"COORDINATOR_DATABASE_URL": pg.DSN, "COORDINATOR_LOCK_REDIS_URL": rd.URL, "COORDINATOR_LOCK_KEY_PREFIX": rd.Prefix,
			"COORDINATOR_REPLICA_ID": replica, "COORDINATOR_LOCK_WAIT_TIME": "100ms", "COORDINATOR_BILLRUN_BATCH_SIZE": "50",
		}
	}

	// The latest month closed in UTC (the default billing zone).
	latest := billrun.PeriodOf(time.Now().UTC()).Previous().String()
	code, out, errs := runCLI(t, env("seeder"), "seed", "--subscribers", "500", "--suspended-ratio", "0.1",
		"--terminated-ratio", "0.1", "--usage", "--period", latest)
	require.Equal(t, 0, code, errs)
	var seeded struct {
		Subscribers  int64 `json:"subscribers"`
		Active       int64 `json:"active"`
		UsageCharges int64 `json:"usage_charges"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &seeded), out)
	require.Equal(t, int64(500), seeded.Subscribers)
	require.Positive(t, seeded.UsageCharges)
	// Idempotent: the same ids again create nothing.
	code, out, errs = runCLI(t, env("seeder"), "seed", "--subscribers", "500", "--usage", "--period", latest)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, `"subscribers":0`)

	// Nothing to adjust before the bill run: refused on the caller's input (64), not a failure (1).
	code, out, errs = runCLI(t, env("cli-a"), "run", "billrun", "--period", latest, "--adjust")
	require.Equal(t, job.ExitUsage, code, errs)
	var res job.Result
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, job.OutcomeFailed, res.Outcome)
	require.True(t, res.BadInput, out)
	require.Contains(t, res.Error, "has no bill run")

	code, out, errs = runCLI(t, env("cli-a"), "run", "billrun", "--period", latest, "--request-id", "r-1")
	require.Equal(t, job.ExitOK, code, errs)
	res = job.Result{}
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, job.OutcomeCompleted, res.Outcome)
	require.Equal(t, "billrun", res.Job)
	require.Equal(t, "billrun:"+latest, res.Key)
	require.Equal(t, "r-1", res.RequestID)
	require.Equal(t, "cli-a", res.Owner)
	require.Equal(t, seeded.Active, res.Counts["invoices_created"])
	for _, typ := range []string{`"type":"ownership.acquired"`, `"type":"run.completed"`, `"type":"ownership.released"`} {
		require.Contains(t, errs, typ)
	}
	var invoices int64
	require.NoError(t, pg.Pool.QueryRow(context.Background(), `select count(*) from invoices where period = $1`, latest).Scan(&invoices))
	require.Equal(t, seeded.Active, invoices)

	code, out, errs = runCLI(t, env("cli-b"), "run", "billrun", "--period", latest)
	require.Equal(t, job.ExitOK, code, errs)
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, job.OutcomeAlreadyCompleted, res.Outcome)
	require.Equal(t, "cli-a", res.Owner)
	require.Contains(t, errs, `"type":"run.already_completed"`)

	// Usage that arrives after COMPLETED: the next answer reports it, --adjust invoices it.
	_, err := pg.Pool.Exec(context.Background(), `insert into usage_charges (subscriber_id, period, amount_cents)
		select min(subscriber_id), $1, 333 from invoices where period = $1`, latest)
	require.NoError(t, err)
	code, out, errs = runCLI(t, env("cli-b"), "run", "billrun", "--period", latest)
	require.Equal(t, job.ExitOK, code, errs)
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, job.OutcomeAlreadyCompleted, res.Outcome)
	require.Equal(t, int64(1), res.Counts["late_usage_subscribers"])
	require.Equal(t, int64(333), res.Counts["late_usage_cents"])
	require.Contains(t, errs, `"type":"billrun.late_usage"`)
	code, out, errs = runCLI(t, env("cli-b"), "run", "billrun", "--period", latest, "--adjust")
	require.Equal(t, job.ExitOK, code, errs)
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(1), res.Counts["adjustments_created"])
	require.Equal(t, int64(333), res.Counts["adjusted_cents"])

	unreachable := env("cli-c")
	unreachable["COORDINATOR_LOCK_REDIS_URL"] = "redis://127.0.0.1:1/0"
	code, out, _ = runCLI(t, unreachable, "run", "billrun", "--period", billrun.PeriodOf(time.Now().UTC()).Previous().Previous().String())
	require.Equal(t, job.ExitUnavailable, code)
	require.Contains(t, out, `"outcome":"unavailable"`)
}

func TestRunBillrunBadInput(t *testing.T) {
	t.Parallel()
	env := map[string]string{"COORDINATOR_DATABASE_URL": "postgres://127.0.0.1:1/none"}
	open := billrun.PeriodOf(time.Now().UTC())
	for _, args := range [][]string{
		{"run", "billrun"},
		{"run", "billrun", "--period", open.String()},             // not closed
		{"run", "billrun", "--period", open.String(), "--force"},  // not closed, forced
		{"run", "billrun", "--period", open.Next().String()},      // future
		{"run", "billrun", "--period", "2999-12"},                 // future
		{"run", "billrun", "--period", "2000-01"},                 // older than 24 months, not forced
		{"run", "billrun", "--period", open.String(), "--adjust"}, // not closed
		{"trigger", "billrun", "--period", open.String()},         // refused before producing
		{"run", "billrun", "--period", "2026-13"},
		{"run", "billrun", "--period", "1999-12"},
		{"run", "billrun", "--period", "2026-11", "extra"},
		{"seed", "--subscribers", "-1"},
		{"seed", "--subscribers", "10", "--suspended-ratio", "0.7", "--terminated-ratio", "0.5"},
		{"seed", "--subscribers", "10", "--period", "2026-1"},
	} {
		code, _, errs := runCLI(t, env, args...)
		require.Equal(t, job.ExitUsage, code, "%v: %s", args, errs)
	}
	_, _, errs := runCLI(t, env, "run", "billrun", "--period", "2026-13")
	require.Contains(t, errs, `"2026-13"`, "the message names the bad value")
	_, _, errs = runCLI(t, env, "run", "billrun", "--period", open.String(), "--force")
	require.Contains(t, errs, "period_not_closed")
	require.Contains(t, errs, open.String()+" is not closed in the billing zone UTC")
	berlin := map[string]string{"COORDINATOR_DATABASE_URL": "postgres://127.0.0.1:1/none", "COORDINATOR_BILLING_TZ": "Europe/Berlin"}
	_, _, errs = runCLI(t, berlin, "run", "billrun", "--period", open.String())
	require.Contains(t, errs, "billing zone Europe/Berlin", "the deployment's zone")
	code, _, errs := runCLI(t, map[string]string{"COORDINATOR_BILLING_TZ": "Mars/Olympus"}, "run", "billrun", "--period", "2026-11")
	require.Equal(t, job.ExitUsage, code)
	require.Contains(t, errs, "COORDINATOR_BILLING_TZ")
}

// Postgres unreachable is a transient failure: the result says retryable and
// the CLI exits 75 (EX_TEMPFAIL), so a scheduler retries it; a bad password
// or another permanent failure stays 1. Before, it exited 1 like a bug.
func TestRunBillrunPostgresDownExits75(t *testing.T) {
	t.Parallel()
	srv := testenv.StartPostgresServer(t)
	srv.Stop()
	rd := testenv.Redis(t)
	env := map[string]string{"COORDINATOR_DATABASE_URL": srv.DSN(), "COORDINATOR_LOCK_REDIS_URL": rd.URL,
		"COORDINATOR_LOCK_KEY_PREFIX": rd.Prefix, "COORDINATOR_REPLICA_ID": "cli"}
	latest := billrun.PeriodOf(time.Now().UTC()).Previous().String()
	code, out, errs := runCLI(t, env, "run", "billrun", "--period", latest)
	require.Equal(t, job.ExitTempFail, code, errs)
	var res job.Result
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, job.OutcomeFailed, res.Outcome)
	require.True(t, res.Retryable, out)
	require.Contains(t, res.Error, "connection refused")
}

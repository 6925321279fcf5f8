package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/msisdnreaper"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func TestRunReaper(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	rd := testenv.Redis(t)
	_, err := msisdnreaper.Seed(context.Background(), pg.Pool, msisdnreaper.SeedSpec{StaleReserved: 2500, ValidReserved: 10, Free: 10})
	require.NoError(t, err)
	env := func(replica string) map[string]string {
		return map[string]string{
			"COORDINATOR_DATABASE_URL": pg.DSN, "COORDINATOR_LOCK_REDIS_URL": rd.URL, "COORDINATOR_LOCK_KEY_PREFIX": rd.Prefix,
			"COORDINATOR_REPLICA_ID": replica, "COORDINATOR_LOCK_WAIT_TIME": "100ms",
			// @every 30s: the sweep keeps its lock at least 15 s.
		}
	}

	code, out, errs := runCLI(t, env("cli-a"), "run", "reaper", "--request-id", "r-1")
	require.Equal(t, job.ExitOK, code, errs)
	var res job.Result
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, job.OutcomeCompleted, res.Outcome)
	require.Equal(t, "msisdn-reaper", res.Job)
	require.Equal(t, "msisdn-reaper:sweep", res.Key)
	require.Equal(t, "r-1", res.RequestID)
	require.Equal(t, int64(2500), res.Counts["freed"])
	for _, typ := range []string{`"type":"ownership.acquired"`, `"type":"run.completed"`, `"type":"ownership.released"`} {
		require.Contains(t, errs, typ)
	}

	// The run released its lock when it exited, minimum hold or not: a
	// process that is gone cannot keep a hold by timer, and a rerun must not
	// wait out the TTL to be told a gone process owns the sweep (it did:
	// exit 75 naming cli-a for 20 s).
	n, err := rd.Client.Exists(context.Background(), rd.Prefix+":{"+msisdnreaper.SweepKey+"}:lock").Result()
	require.NoError(t, err)
	require.Zero(t, n, "the lock is gone once the command returned")
	code, out, errs = runCLI(t, env("cli-b"), "run", "reaper")
	require.Equal(t, job.ExitOK, code, errs)
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, job.OutcomeCompleted, res.Outcome)
	require.Equal(t, int64(0), res.Counts["freed"])

	// A holder that is alive: already owned, exit 75, owner named.
	holder, err := redislock.New(rd.Client, redislock.Config{Prefix: rd.Prefix, Owner: "cli-holder"})
	require.NoError(t, err)
	defer holder.Close()
	held, err := holder.Acquire(context.Background(), msisdnreaper.SweepKey, 0)
	require.NoError(t, err)
	code, out, errs = runCLI(t, env("cli-c"), "run", "reaper")
	require.Equal(t, job.ExitAlreadyOwned, code, errs)
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, job.OutcomeAlreadyOwned, res.Outcome)
	require.Equal(t, "cli-holder", res.Owner)
	require.Contains(t, errs, `"type":"ownership.already_owned"`)
	require.Contains(t, errs, `"owner":"cli-holder"`)
	require.NoError(t, held.Release(context.Background()))

	// Lock backend unreachable: exit 69, nothing runs.
	unreachable := env("cli-c")
	unreachable["COORDINATOR_LOCK_REDIS_URL"] = "redis://127.0.0.1:1/0"
	code, out, _ = runCLI(t, unreachable, "run", "reaper")
	require.Equal(t, job.ExitUnavailable, code)
	require.Contains(t, out, `"outcome":"unavailable"`)
}

func TestRunReaperBadUsage(t *testing.T) {
	t.Parallel()
	env := map[string]string{"COORDINATOR_DATABASE_URL": "postgres://u@127.0.0.1:1/x"}
	for _, args := range [][]string{
		{"run", "reaper", "extra"},
		{"run", "reaper", "--workers", "0"},
		{"run", "reaper", "--reaper-batch-size", "0"},
	} {
		code, _, errs := runCLI(t, env, args...)
		require.Equal(t, job.ExitUsage, code, strings.Join(args, " ")+": "+errs)
	}
	code, _, errs := runCLI(t, map[string]string{}, "run", "reaper")
	require.Equal(t, job.ExitUsage, code)
	require.Contains(t, errs, "COORDINATOR_DATABASE_URL")
}

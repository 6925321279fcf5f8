package main

import (
	"context"
	"fmt"
	"time"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/msisdnreaper"
	"github.com/telco-platform/coordinator/internal/postgres"
)

func init() { runJobs["reaper"] = runReaper }

// runReaper is `coordinator run reaper`: one owned sweep of stale MSISDN
// reservations (the Kubernetes CronJob variant, or an operator's manual run).
// The result is one JSON object on stdout, the events JSON lines on stderr,
// and the exit code DESIGN.md names for the outcome.
func runReaper(ctx context.Context, cio cliIO, args []string) int {
	fs := newFlagSet(cio, "run reaper")
	workers := fs.Int("workers", msisdnreaper.DefaultWorkers, "concurrent batch transactions")
	requestID := fs.String("request-id", "", "request id carried by the events (default: a random id)")
	cfg, rest, code := parseConfig(cio, fs, args)
	if code != 0 {
		return code
	}
	if len(rest) > 0 {
		fmt.Fprintf(cio.stderr, "coordinator run reaper: unexpected arguments %q\n", rest)
		return job.ExitUsage
	}
	if err := cfg.RequireDatabase(); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator run reaper: %v\n", err)
		return job.ExitUsage
	}
	if *workers < 1 {
		fmt.Fprintf(cio.stderr, "coordinator run reaper: --workers = %d: must be at least 1\n", *workers)
		return job.ExitUsage
	}
	log := newLogger(cfg, cio.stderr)
	scfg := msisdnreaper.Config{ReplicaID: cfg.ReplicaID, Lease: cfg.ReaperLease, BatchSize: cfg.ReaperBatchSize,
		Workers: *workers, MinHold: cfg.ReaperMinHold, Logger: log}
	if err := scfg.Validate(); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator run reaper: %v\n", err)
		return job.ExitUsage
	}
	t := job.Trigger{Source: job.SourceCLI, RequestID: *requestID, RequestedBy: cfg.ReplicaID}
	if t.RequestID == "" {
		t.RequestID = events.NewID()
	}
	failed := func(err error, outcome job.Outcome) int {
		return printResult(cio, job.Result{Job: msisdnreaper.JobName, Key: msisdnreaper.SweepKey, Outcome: outcome,
			Replica: cfg.ReplicaID, RequestID: t.RequestID, Error: err.Error()})
	}

	connectCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pool, err := postgres.Connect(connectCtx, cfg.DatabaseURL, int32(*workers)+1)
	if err != nil {
		return failed(err, job.OutcomeFailed)
	}
	defer pool.Close()
	locker, err := openLocker(ctx, cfg, log, nil)
	if err != nil {
		return failed(err, job.OutcomeUnavailable)
	}
	// Closing the locker does not delete a lock the sweep left to expire
	// for its minimum hold.
	defer func() { _ = locker.Close() }()

	sweeper := msisdnreaper.NewSweeper(pool, locker, events.NewJSONLines(cio.stderr), scfg)
	return printResult(cio, sweeper.Sweep(ctx, t))
}

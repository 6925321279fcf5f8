package main

import (
	"context"
	"fmt"
	"os/user"
	"time"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/postgres"
)

func init() {
	runJobs["billrun"] = runBillrun
}

func runBillrun(ctx context.Context, cio cliIO, args []string) int {
	fs := newFlagSet(cio, "run billrun")
	periodFlag := fs.String("period", "", "billing period YYYY-MM (2000-01..2999-12), required")
	requestID := fs.String("request-id", "", "request id carried by events and the result (default: random)")
	cfg, rest, code := parseConfig(cio, fs, args)
	if code != 0 {
		return code
	}
	if len(rest) != 0 || *periodFlag == "" {
		fmt.Fprintln(cio.stderr, "usage: coordinator run billrun --period YYYY-MM [--request-id ID] [flags]")
		return job.ExitUsage
	}
	period, err := billrun.ParsePeriod(*periodFlag)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator run billrun: --period: %v\n", err)
		return job.ExitUsage
	}
	if err := cfg.RequireDatabase(); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator run billrun: %v\n", err)
		return job.ExitUsage
	}
	// TEST HOOK (envTestBatchDelay, shared with serve in cmd_serve.go): each
	// batch worker waits this long before starting a batch transaction, so
	// process tests (kill -9 mid-run, SIGSTOP of the owner) catch a run in
	// the middle. Unset in production; not part of the configuration contract.
	var delay time.Duration
	if v := cio.getenv(envTestBatchDelay); v != "" {
		if delay, err = time.ParseDuration(v); err != nil || delay < 0 {
			fmt.Fprintf(cio.stderr, "coordinator run billrun: %s = %q: not a duration\n", envTestBatchDelay, v)
			return job.ExitUsage
		}
	}

	start := time.Now()
	trig := job.Trigger{Source: job.SourceCLI, RequestID: *requestID, RequestedBy: currentUser()}
	if trig.RequestID == "" {
		trig.RequestID = events.NewID()
	}
	failed := func(o job.Outcome, err error) int {
		return printResult(cio, job.Result{
			Job: billrun.JobName, Key: billrun.LockKey(period), Outcome: o, Replica: cfg.ReplicaID,
			RequestID: trig.RequestID, Error: err.Error(), DurationMS: time.Since(start).Milliseconds(),
		})
	}

	log := newLogger(cfg, cio.stderr)
	pool, err := postgres.Connect(ctx, cfg.DatabaseURL, int32(cfg.BillrunWorkers+2))
	if err != nil {
		log.Error("billrun_postgres_unreachable", "err", err)
		return failed(job.OutcomeFailed, err)
	}
	defer pool.Close()
	locker, err := openLocker(ctx, cfg, log, nil)
	if err != nil {
		log.Error("billrun_lock_backend_unavailable", "err", err)
		return failed(job.OutcomeUnavailable, err)
	}
	defer func() { _ = locker.Close() }()

	rcfg := billrun.Config{
		ReplicaID: cfg.ReplicaID,
		BatchSize: cfg.BillrunBatchSize,
		Workers:   cfg.BillrunWorkers,
		Logger:    log,
	}
	if delay > 0 {
		log.Warn("test_hook_enabled", "hook", envTestBatchDelay, "delay", delay)
		rcfg.BeforeBatch = func(ctx context.Context, _, _ int64) error {
			t := time.NewTimer(delay)
			defer t.Stop()
			select {
			case <-t.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	runner := billrun.New(pool, locker, events.NewJSONLines(cio.stderr), rcfg)
	return printResult(cio, runner.Run(ctx, period, trig))
}

func currentUser() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return ""
}

package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/kinds"
	"github.com/telco-platform/coordinator/internal/replica"
)

func init() {
	register(command{name: "serve", summary: "run a replica: Kafka, cron and HTTP triggers; events to Kafka", run: runServe, ownHelp: true})
}

// Test hooks (testhooks.go), read only by binaries built with -tags
// testhooks, which the process tests (internal/e2e, internal/billrun)
// build. They are not part of the configuration contract.
const (
	// envTestBatchDelay slows every batch of the kinds that offer it (a Go
	// duration), so a test can kill or stop the owner mid-run.
	envTestBatchDelay = "COORDINATOR_TEST_BILLRUN_BATCH_DELAY"
	// envTestRedisAddrMap makes the lock's Redis client dial each listed
	// address at another ("host:port=host:port,..."): the chaos verifier
	// routes every process through proxies of its own, including the
	// master and replica addresses a Sentinel answers with. Every command
	// that opens the lock reads it (serve, lock, run, locks).
	envTestRedisAddrMap = "COORDINATOR_TEST_REDIS_ADDR_MAP"
)

// runServe runs one replica (internal/replica assembles it) until the first
// signal, then shuts it down in reverse start order.
func runServe(ctx context.Context, cio cliIO, args []string) int {
	cfg, rest, code := loadConfig(cio, "serve", args)
	if code != 0 {
		return code
	}
	if len(rest) != 0 {
		fmt.Fprintf(cio.stderr, "coordinator serve: unexpected arguments %q\nusage: coordinator serve [flags]\n", rest)
		return job.ExitUsage
	}
	if err := cfg.RequireDatabase(); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator serve: %v\n", err)
		return job.ExitUsage
	}
	log := newLogger(cfg, cio.stderr)
	kc := kinds.ConfigOf(cfg)
	if err := applyTestHooks(cio.getenv, log, &kc); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator serve: %v\n", err)
		return job.ExitUsage
	}
	reg, err := kc.Registry()
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator serve: %v\n", err)
		return job.ExitFailed
	}
	tel, flush, code := setupTelemetry(ctx, cio, "serve", cfg, log)
	if code != 0 {
		return code
	}
	defer flush()
	r := replica.New(replica.Config{Config: cfg, Log: log, OpenLocker: openLocker, Kinds: reg, Version: versionString(),
		Revision: vcsRevision(), Telemetry: tel})
	defer r.Stop()
	if err := r.Start(ctx); err != nil {
		var se *replica.StartError
		if errors.As(err, &se) {
			log.Error("serve_start_failed", "step", se.Step, "error", se.Err)
			return se.Code
		}
		log.Error("serve_start_failed", "error", err)
		return job.ExitFailed
	}
	<-ctx.Done()
	log.Info("shutdown_started", "timeout_ms", cfg.ShutdownTimeout.Milliseconds())
	start := time.Now()
	r.Stop()
	log.Info("shutdown_complete", "duration_ms", time.Since(start).Milliseconds())
	return 0
}

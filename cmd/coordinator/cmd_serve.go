package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/replica"
)

func init() {
	register(command{name: "serve", summary: "run a replica: Kafka, cron and HTTP triggers; events to Kafka", run: runServe})
}

// Test hooks, read only here and only by the end-to-end tests (internal/e2e).
// They are not part of DESIGN.md's configuration contract.
const (
	// envTestBatchDelay slows every bill-run batch (a Go duration), so a test
	// can kill the owner mid-run.
	envTestBatchDelay = "COORDINATOR_TEST_BILLRUN_BATCH_DELAY"
	// envTestSessionTimeout shortens the Kafka group session timeout, so a
	// killed replica's partitions move within seconds instead of 45 s.
	envTestSessionTimeout = "COORDINATOR_TEST_KAFKA_SESSION_TIMEOUT"
)

// runServe runs one replica (internal/replica assembles it; `coordinator
// demo` runs three of the same) until the first signal, then shuts it down
// in reverse start order.
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
	hooks, err := readServeHooks(cio.getenv)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator serve: %v\n", err)
		return job.ExitUsage
	}
	log := newLogger(cfg, cio.stderr)
	if hooks.batchDelay > 0 {
		log.Warn("test_hook_enabled", "hook", envTestBatchDelay, "delay", hooks.batchDelay)
	}
	if hooks.sessionTimeout > 0 {
		log.Warn("test_hook_enabled", "hook", envTestSessionTimeout, "session_timeout", hooks.sessionTimeout)
	}
	r := replica.New(replica.Config{Config: cfg, Log: log, OpenLocker: openLocker, Version: version,
		BatchDelay: hooks.batchDelay, SessionTimeout: hooks.sessionTimeout})
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
	log.Info("shutdown_started", "timeout", cfg.ShutdownTimeout)
	start := time.Now()
	r.Stop()
	log.Info("shutdown_complete", "took_ms", time.Since(start).Milliseconds())
	return 0
}

type serveHooks struct {
	batchDelay     time.Duration
	sessionTimeout time.Duration
}

func readServeHooks(getenv func(string) string) (serveHooks, error) {
	var h serveHooks
	for _, v := range []struct {
		env string
		dst *time.Duration
	}{{envTestBatchDelay, &h.batchDelay}, {envTestSessionTimeout, &h.sessionTimeout}} {
		raw := getenv(v.env)
		if raw == "" {
			continue
		}
		d, err := time.ParseDuration(raw)
		if err != nil || d < 0 {
			return h, fmt.Errorf("config: %s = %q: not a duration", v.env, raw)
		}
		*v.dst = d
	}
	return h, nil
}

// scheduleLocation is the time zone a cron spec fires in (replica.ScheduleLocation).
func scheduleLocation(spec string) *time.Location { return replica.ScheduleLocation(spec) }

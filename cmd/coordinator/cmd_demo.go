package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/telco-platform/coordinator/internal/demo"
	"github.com/telco-platform/coordinator/internal/job"
)

func init() {
	register(command{name: "demo", summary: "the whole mission locally: 3 replicas, local Redis+PostgreSQL, in-process Kafka", run: runDemo})
}

func runDemo(ctx context.Context, cio cliIO, args []string) int {
	fs := newFlagSet(cio, "demo")
	subscribers := fs.Int64("subscribers", 100000, "subscribers to seed (5% SUSPENDED, 2% TERMINATED)")
	stale := fs.Int("stale-reservations", 10000, "expired MSISDN reservations for the reaper to free")
	replicas := fs.Int("replicas", 3, "replicas to run in this process")
	wait := fs.Duration("lock-wait", 500*time.Millisecond, "how long a replica waits for a held lock before answering already_owned")
	timeout := fs.Duration("timeout", 100*time.Second, "give up after this long once the replicas run")
	redisServer := fs.String("redis-server", cio.getenv("COORDINATOR_TEST_REDIS_SERVER_BIN"), "redis-server binary (default: PATH, /usr/bin) ($COORDINATOR_TEST_REDIS_SERVER_BIN)")
	pgBinDir := fs.String("pg-bin-dir", cio.getenv("COORDINATOR_TEST_PG_BIN_DIR"), "directory with initdb and postgres (default: newest /usr/lib/postgresql/*/bin, PATH) ($COORDINATOR_TEST_PG_BIN_DIR)")
	verbose := fs.Bool("verbose", false, "write the replicas' logs to stderr instead of a temporary file")
	if err := fs.Parse(args); err != nil {
		return job.ExitUsage
	}
	if fs.NArg() != 0 || *subscribers < 1 || *stale < 0 || *replicas < 1 || *replicas > 9 {
		fmt.Fprintln(cio.stderr, "usage: coordinator demo [--subscribers N>=1] [--stale-reservations N>=0] [--replicas 1..9] [--timeout D] [--verbose]")
		return job.ExitUsage
	}
	bins, err := demo.FindBinaries(*redisServer, *pgBinDir)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator demo: %v\n", err)
		return job.ExitUnavailable
	}
	cfg := demo.Config{
		Subscribers: *subscribers, StaleReservations: *stale, Replicas: *replicas, LockWaitTime: *wait,
		Timeout: *timeout, Binaries: bins, OpenLocker: openLocker, Out: cio.stdout,
	}
	if *stale == 0 {
		cfg.StaleReservations = -1 // none (0 means the default)
	}
	if *verbose {
		cfg.Log = cio.stderr
		cfg.LogLevel = slog.LevelInfo
	}
	if err := demo.Run(ctx, cfg); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator demo: %v\n", err)
		switch {
		case errors.Is(err, demo.ErrMissingBinary):
			return job.ExitUnavailable
		case ctx.Err() != nil:
			return 130
		}
		return job.ExitFailed
	}
	return 0
}

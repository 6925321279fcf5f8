// Command coordinator-demo runs the coordinator's whole mission on one
// machine (internal/demo): a throwaway PostgreSQL cluster and redis-server,
// an in-process Kafka, three replicas, one bill-run trigger fired from
// Kafka, HTTP and cron at once, the ownership timeline and a summary. It is
// its own program so that the production binary carries neither the demo
// nor the in-process Kafka. `make demo` builds and runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/telco-platform/coordinator/internal/base10"
	"github.com/telco-platform/coordinator/internal/demo"
	"github.com/telco-platform/coordinator/internal/job"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Stdout, os.Stderr, os.Getenv, os.Args[1:]))
}

func run(ctx context.Context, stdout, stderr io.Writer, getenv func(string) string, args []string) int {
	fs := flag.NewFlagSet("coordinator-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	subscribers := base10.Int64(fs, "subscribers", 100000, "`N` subscribers to seed (5% SUSPENDED, 2% TERMINATED)")
	stale := base10.Int(fs, "stale-reservations", 10000, "`N` expired MSISDN reservations for the reaper to free")
	replicas := base10.Int(fs, "replicas", 3, "`N` replicas to run in this process (1..9)")
	wait := fs.Duration("lock-wait", 500*time.Millisecond, "how long a replica waits for a held lock before answering already_owned")
	timeout := fs.Duration("timeout", 100*time.Second, "give up after this long once the replicas run")
	redisServer := fs.String("redis-server", getenv("COORDINATOR_TEST_REDIS_SERVER_BIN"), "redis-server `binary` (default: PATH, /usr/bin) ($COORDINATOR_TEST_REDIS_SERVER_BIN)")
	pgBinDir := fs.String("pg-bin-dir", getenv("COORDINATOR_TEST_PG_BIN_DIR"), "`directory` with initdb and postgres (default: newest /usr/lib/postgresql/*/bin, PATH) ($COORDINATOR_TEST_PG_BIN_DIR)")
	verbose := fs.Bool("verbose", false, "write the replicas' logs to stderr instead of a temporary file")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: coordinator-demo [flags]\n\nflags:")
		fs.PrintDefaults()
	}
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			fs.SetOutput(stdout)
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return job.ExitOK
		}
		return job.ExitUsage
	}
	if fs.NArg() != 0 || *subscribers < 1 || *stale < 0 || *replicas < 1 || *replicas > 9 {
		fmt.Fprintln(stderr, "usage: coordinator-demo [--subscribers N>=1] [--stale-reservations N>=0] [--replicas 1..9] [--timeout D] [--verbose]")
		return job.ExitUsage
	}
	bins, err := demo.FindBinaries(*redisServer, *pgBinDir)
	if err != nil {
		fmt.Fprintf(stderr, "coordinator-demo: %v\n", err)
		return job.ExitUnavailable
	}
	cfg := demo.Config{
		Subscribers: *subscribers, StaleReservations: *stale, Replicas: *replicas, LockWaitTime: *wait,
		Timeout: *timeout, Binaries: bins, Out: stdout,
	}
	if *stale == 0 {
		cfg.StaleReservations = -1 // none (0 means the default)
	}
	if *verbose {
		cfg.Log = stderr
		cfg.LogLevel = slog.LevelInfo
	}
	if err := demo.Run(ctx, cfg); err != nil {
		fmt.Fprintf(stderr, "coordinator-demo: %v\n", err)
		switch {
		case errors.Is(err, demo.ErrMissingBinary):
			return job.ExitUnavailable
		case ctx.Err() != nil:
			return 130
		}
		return job.ExitFailed
	}
	return job.ExitOK
}

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/lockrun"
	"github.com/telco-platform/coordinator/internal/ownership"
)

func init() {
	register(command{
		name:        "lock",
		summary:     "--key K [--lease D] [--wait D] [--grace D] -- CMD ARGS...: run a command holding a lock",
		run:         runLock,
		ownsSignals: true,
	})
}

// runLock parses lock's flags and the configuration, and hands the run to
// lockrun with a Locker opened from that configuration.
func runLock(ctx context.Context, cio cliIO, args []string) int {
	a, err := lockrun.ParseArgs(args)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator lock: %v\n\n%s\n", err, lockrun.Usage)
		return job.ExitUsage
	}
	cfg, rest, code := loadConfig(cio, "lock", a.Config)
	if code != 0 {
		return code
	}
	if len(rest) > 0 {
		fmt.Fprintf(cio.stderr, "coordinator lock: unexpected arguments %q\n\n%s\n", rest, lockrun.Usage)
		return job.ExitUsage
	}
	if a.WaitSet {
		cfg.Lock.WaitTime = a.Wait
	}
	return lockrun.Run(ctx, lockRunConfig(a, cfg, cio, newLogger(cfg, cio.stderr)))
}

// lockRunConfig wires one lock run: the Locker from the configuration, the
// process's streams and environment, and what the command must not get of
// it: every variable the coordinator reads as configuration.
func lockRunConfig(a lockrun.Args, cfg config.Config, cio cliIO, log *slog.Logger) lockrun.Config {
	return lockrun.Config{
		Args:            a,
		WatchdogTimeout: cfg.Lock.WatchdogTimeout,
		Wait:            cfg.Lock.WaitTime,
		Open: func(ctx context.Context, minTrust time.Duration) (ownership.Locker, error) {
			return openLockerMinTrust(ctx, cfg, log, nil, minTrust)
		},
		Log:     log,
		Stdin:   cio.stdin,
		Stdout:  cio.stdout,
		Stderr:  cio.stderr,
		Environ: os.Environ(),
		Removed: config.IsVariable,
	}
}

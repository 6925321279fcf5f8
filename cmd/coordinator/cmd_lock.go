package main

import (
	"context"
	"fmt"
	"os"
	"time"

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
		cfg.LockWaitTime = a.Wait
	}
	log := newLogger(cfg, cio.stderr)
	return lockrun.Run(ctx, lockrun.Config{
		Args:            a,
		WatchdogTimeout: cfg.LockWatchdogTimeout,
		Open: func(ctx context.Context, minTrust time.Duration) (ownership.Locker, error) {
			return openLockerMinTrust(ctx, cfg, log, nil, minTrust)
		},
		Log:     log,
		Stdin:   cio.stdin,
		Stdout:  cio.stdout,
		Stderr:  cio.stderr,
		Environ: os.Environ(),
	})
}

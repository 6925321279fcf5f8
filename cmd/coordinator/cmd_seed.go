package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/telco-platform/coordinator/internal/base10"
	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/postgres"
)

func init() {
	register(command{name: "seed", summary: "--subscribers N [--suspended-ratio R] [--terminated-ratio R] [--usage] [--period P] [--reset]: demo billing data", run: runSeed, ownHelp: true})
}

func runSeed(ctx context.Context, cio cliIO, args []string) int {
	fs := newFlagSet(cio, "seed", "--subscribers N [--first-id ID] [--suspended-ratio R] [--terminated-ratio R] [--usage] [--period YYYY-MM] [--reset] [flags]")
	n := base10.Int64(fs, "subscribers", 0, "subscribers to create (ids from --first-id on; existing ids are kept)")
	firstID := base10.Int64(fs, "first-id", 1, "first subscriber id")
	suspended := fs.Float64("suspended-ratio", 0, "share of SUSPENDED subscribers, 0..1")
	terminated := fs.Float64("terminated-ratio", 0, "share of TERMINATED subscribers, 0..1")
	usage := fs.Bool("usage", false, "add rated usage charges for --period")
	periodFlag := fs.String("period", "", "usage period YYYY-MM (default: the previous month)")
	reset := fs.Bool("reset", false, "empty subscribers, usage, invoices and bill runs first")
	force := fs.Bool("force", false, "seed a database that is not marked disposable (docs/security.md)")
	cfg, rest, code := parseConfig(cio, fs, args)
	if code != 0 {
		return code
	}
	if len(rest) != 0 || *n < 0 || *firstID < 1 || *suspended < 0 || *terminated < 0 || *suspended+*terminated > 1 {
		fmt.Fprintln(cio.stderr, "usage: coordinator seed --subscribers N [--first-id ID] [--suspended-ratio R] [--terminated-ratio R] [--usage] [--period YYYY-MM] [--reset]")
		fmt.Fprintln(cio.stderr, "  N >= 0, ID >= 1, ratios within 0..1 with a sum at most 1")
		return job.ExitUsage
	}
	period := billrun.PeriodOf(time.Now().UTC()).Previous()
	if *periodFlag != "" {
		p, err := billrun.ParsePeriod(*periodFlag)
		if err != nil {
			fmt.Fprintf(cio.stderr, "coordinator seed: --period: %v\n", err)
			return job.ExitUsage
		}
		period = p
	}
	if err := cfg.RequireDatabase(); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator seed: %v\n", err)
		return job.ExitUsage
	}
	pool, err := postgres.Connect(ctx, cfg.DatabaseURL, 2)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator seed: %v\n", err)
		return job.ExitUnavailable
	}
	defer pool.Close()
	if code := requireDisposable(ctx, cio, pool, "seed", *force); code != 0 {
		return code
	}

	start := time.Now()
	res, err := billrun.Seed(ctx, pool, billrun.SeedConfig{
		Subscribers: *n, FirstID: *firstID, SuspendedRatio: *suspended, TerminatedRatio: *terminated,
		Usage: *usage, Period: period, Reset: *reset,
	})
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator seed: %v\n", err)
		return job.ExitFailed
	}
	out := struct {
		billrun.SeedResult
		Period     string `json:"usage_period,omitempty"`
		DurationMS int64  `json:"duration_ms"`
	}{SeedResult: res, DurationMS: time.Since(start).Milliseconds()}
	if *usage {
		out.Period = period.String()
	}
	b, _ := json.Marshal(out)
	fmt.Fprintln(cio.stdout, string(b))
	return 0
}

package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/migrate"
	"github.com/telco-platform/coordinator/internal/postgres"
)

func init() {
	register(command{name: "migrate", summary: "up|down|status: apply, reverse (all) or list the embedded migrations", run: runMigrate})
}

func runMigrate(ctx context.Context, cio cliIO, args []string) int {
	cfg, rest, code := loadConfig(cio, "migrate", args)
	if code != 0 {
		return code
	}
	if len(rest) != 1 || (rest[0] != "up" && rest[0] != "down" && rest[0] != "status") {
		fmt.Fprintln(cio.stderr, "usage: coordinator migrate up|down|status [flags]")
		return job.ExitUsage
	}
	if err := cfg.RequireDatabase(); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator migrate: %v\n", err)
		return job.ExitUsage
	}
	pool, err := postgres.Connect(ctx, cfg.DatabaseURL, 2)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator migrate: %v\n", err)
		return job.ExitUnavailable
	}
	defer pool.Close()
	m, err := migrate.New(pool)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator migrate: %v\n", err)
		return job.ExitFailed
	}
	defer m.Close()

	switch rest[0] {
	case "status":
		st, err := m.Status(ctx)
		if err != nil {
			fmt.Fprintf(cio.stderr, "coordinator migrate: %v\n", err)
			return job.ExitFailed
		}
		tw := tabwriter.NewWriter(cio.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tNAME\tSTATE\tAPPLIED AT")
		for _, s := range st {
			state := "pending"
			if s.Applied {
				state = "applied"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Version, s.Name, state, s.At)
		}
		_ = tw.Flush()
		return 0
	default:
		run, verb := m.Up, "applied"
		if rest[0] == "down" {
			run, verb = m.DownAll, "reverted"
		}
		done, err := run(ctx)
		if err != nil {
			fmt.Fprintf(cio.stderr, "coordinator migrate: %v\n", err)
			return job.ExitFailed
		}
		if len(done) == 0 {
			fmt.Fprintf(cio.stdout, "migrate %s: nothing to do\n", rest[0])
		}
		for _, a := range done {
			fmt.Fprintf(cio.stdout, "%s %s (%s)\n", verb, a.Name, a.Took)
		}
		return 0
	}
}

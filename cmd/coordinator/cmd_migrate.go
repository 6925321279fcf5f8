package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/migrate"
	"github.com/telco-platform/coordinator/internal/postgres"
)

func init() {
	register(command{name: "migrate", summary: "up|down|status [--json]: apply, reverse (all) or list the embedded migrations", run: runMigrate, ownHelp: true})
}

// migration is one row of `migrate status --json`.
type migration struct {
	Version   int64  `json:"version"`
	Name      string `json:"name"`
	State     string `json:"state"` // applied, pending
	AppliedAt string `json:"applied_at,omitempty"`
}

func runMigrate(ctx context.Context, cio cliIO, args []string) int {
	fs := newFlagSet(cio, "migrate", "up|down|status [--json] [--force] [flags]")
	asJSON := jsonFlag(fs)
	force := fs.Bool("force", false, "migrate down a database that is not marked disposable (docs/security.md)")
	// The verb may come first: `migrate status --json`.
	var verb []string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		verb, args = args[:1], args[1:]
	}
	cfg, rest, code := parseConfig(cio, fs, args)
	if code != 0 {
		return code
	}
	rest = append(verb, rest...)
	if len(rest) != 1 || (rest[0] != "up" && rest[0] != "down" && rest[0] != "status") {
		fmt.Fprintln(cio.stderr, "usage: coordinator migrate up|down|status [--json] [--force] [flags]  (down needs a database marked disposable, or --force)")
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
	if rest[0] == "down" {
		if code := requireDisposable(ctx, cio, pool, "migrate down", *force); code != 0 {
			return code
		}
	}
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
		rows := make([]migration, 0, len(st))
		for _, s := range st {
			m := migration{Version: s.Version, Name: s.Name, State: "pending"}
			if s.Applied {
				m.State, m.AppliedAt = "applied", s.At
			}
			rows = append(rows, m)
		}
		if *asJSON {
			return printJSON(cio, rows)
		}
		tw := tabwriter.NewWriter(cio.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tNAME\tSTATE\tAPPLIED AT")
		for _, m := range rows {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", m.Version, m.Name, m.State, m.AppliedAt)
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

// requireDisposable refuses (64) a destructive command on a database that is
// not marked disposable, unless forced; forced, it warns.
func requireDisposable(ctx context.Context, cio cliIO, pool *pgxpool.Pool, command string, force bool) int {
	ok, name, err := postgres.Disposable(ctx, pool)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", command, err)
		return job.ExitUnavailable
	}
	switch {
	case ok:
		return 0
	case force:
		fmt.Fprintf(cio.stderr, "coordinator %s: --force: database %q is not marked disposable; going ahead\n", command, name)
		return 0
	}
	fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", command, &postgres.NotDisposableError{Database: name, Command: command})
	return job.ExitUsage
}

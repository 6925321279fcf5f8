package main

import (
	"context"
	"fmt"
	"slices"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/migrate"
	"github.com/telco-platform/coordinator/internal/postgres"
)

func init() {
	register(command{name: "migrate", summary: "up|down|status: apply, reverse (all) or list the embedded migrations", run: runMigrate})
}

func runMigrate(ctx context.Context, cio cliIO, args []string) int {
	fs := newFlagSet(cio, "migrate")
	force := fs.Bool("force", false, "migrate down a database that is not marked disposable (docs/security.md)")
	cfg, rest, code := parseConfig(cio, fs, hoistVerb(args, "up", "down", "status"))
	if code != 0 {
		return code
	}
	if len(rest) != 1 || (rest[0] != "up" && rest[0] != "down" && rest[0] != "status") {
		fmt.Fprintln(cio.stderr, "usage: coordinator migrate up|down|status [flags]  (down needs a database marked disposable, or --force)")
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

// hoistVerb moves the first argument that is one of verbs to the end, so that
// flags may follow it (`migrate down --force`): flag parsing stops at the
// first argument that is not a flag.
func hoistVerb(args []string, verbs ...string) []string {
	for i, a := range args {
		if slices.Contains(verbs, a) {
			out := append(slices.Clone(args[:i]), args[i+1:]...)
			return append(out, a)
		}
	}
	return args
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

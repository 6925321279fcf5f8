// Command coordinator decides which replica owns a piece of scheduled work
// (a bill run, an MSISDN reaper sweep), runs it, and proves it with fenced
// writes and ownership events. See README.md and DESIGN.md.
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
	"sort"
	"syscall"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/job"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// command is one subcommand. Each lives in its own cmd_*.go file and adds
// itself with register.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, io cliIO, args []string) int
	// ownsSignals: the command handles SIGINT and SIGTERM itself (lock
	// forwards them to its child and must release on any path); main's
	// cancel-then-exit handling is not installed for it.
	ownsSignals bool
}

// cliIO is what a command may touch of the process.
type cliIO struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
}

var commands = map[string]command{}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("coordinator: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

func main() {
	cio := cliIO{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}
	if len(os.Args) > 1 && commands[os.Args[1]].ownsSignals {
		os.Exit(dispatch(context.Background(), cio, os.Args[1:]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// The first signal cancels ctx (graceful shutdown); a second exits at once.
		<-ctx.Done()
		stop()
		again := make(chan os.Signal, 1)
		signal.Notify(again, os.Interrupt, syscall.SIGTERM)
		<-again
		fmt.Fprintln(os.Stderr, "coordinator: second signal, exiting now")
		os.Exit(130)
	}()
	os.Exit(dispatch(ctx, cio, os.Args[1:]))
}

func dispatch(ctx context.Context, cio cliIO, args []string) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(cio.stderr)
		if len(args) == 0 {
			return job.ExitUsage
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(cio.stderr, "coordinator: unknown command %q\n\n", args[0])
		usage(cio.stderr)
		return job.ExitUsage
	}
	return c.run(ctx, cio, args[1:])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: coordinator <command> [flags]")
	fmt.Fprintln(w)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-9s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nEvery command takes the configuration flags (coordinator <command> -h lists them);")
	fmt.Fprintln(w, "each flag is also a COORDINATOR_* environment variable.")
}

// newFlagSet returns a FlagSet for a command; its errors go to stderr.
func newFlagSet(cio cliIO, name string) *flag.FlagSet {
	fs := flag.NewFlagSet("coordinator "+name, flag.ContinueOnError)
	fs.SetOutput(cio.stderr)
	return fs
}

// parseConfig binds the shared configuration flags to fs (which may already
// hold the command's own flags), parses args and loads the configuration. On
// error it prints a message naming the variable or flag and returns the exit
// code to use (64); otherwise it returns the positional arguments.
func parseConfig(cio cliIO, fs *flag.FlagSet, args []string) (config.Config, []string, int) {
	b := config.Bind(fs, cio.getenv)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return config.Config{}, nil, job.ExitUsage
		}
		return config.Config{}, nil, job.ExitUsage // fs already printed the error
	}
	cfg, err := b.Config()
	if err != nil {
		fmt.Fprintf(cio.stderr, "%s: %v\n", fs.Name(), err)
		return config.Config{}, nil, job.ExitUsage
	}
	return cfg, fs.Args(), 0
}

// loadConfig is parseConfig for commands with no flags of their own.
func loadConfig(cio cliIO, name string, args []string) (config.Config, []string, int) {
	return parseConfig(cio, newFlagSet(cio, name), args)
}

// newLogger builds the process logger from the configuration; it writes to w.
func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if cfg.LogFormat == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(h).With("replica", cfg.ReplicaID)
}

func init() {
	register(command{name: "version", summary: "print the version", run: func(_ context.Context, cio cliIO, _ []string) int {
		fmt.Fprintln(cio.stdout, "coordinator", version)
		return 0
	}})
}

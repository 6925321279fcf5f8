// Command coordinator decides which replica owns a piece of scheduled work
// (a bill run, an MSISDN reaper sweep, a pool replenishment), runs it, and
// proves it with fenced writes and ownership events. See README.md and
// docs/.
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
	"runtime/debug"
	"sort"
	"strings"
	"syscall"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
)

// version is set at build time with -ldflags "-X main.version=..."; empty,
// the binary's build info is used.
var version = ""

// command is one subcommand. Each lives in its own cmd_*.go file and adds
// itself with register.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, io cliIO, args []string) int
	// ownHelp: the command answers -h itself (a FlagSet from newFlagSet).
	// Otherwise dispatch answers -h with the summary and the configuration
	// flags.
	ownHelp bool
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
	// lookupEnv tells an empty variable from an unset one (os.LookupEnv);
	// nil: an empty one is unset.
	lookupEnv func(string) (string, bool)
}

// envOptions are the configuration's view of the process environment.
func (c cliIO) envOptions() []config.Option {
	if c.lookupEnv == nil {
		return nil
	}
	return []config.Option{config.WithLookup(c.lookupEnv)}
}

var commands = map[string]command{}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("coordinator: command registered twice: " + c.name)
	}
	commands[c.name] = c
}

func main() {
	cio := cliIO{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, lookupEnv: os.LookupEnv}
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
	if len(args) == 0 {
		usage(cio.stderr)
		return job.ExitUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		usage(cio.stdout)
		return job.ExitOK
	case "-version", "--version":
		fmt.Fprintln(cio.stdout, "coordinator", versionString())
		return job.ExitOK
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(cio.stderr, "coordinator: unknown command %q\n\n", args[0])
		usage(cio.stderr)
		return job.ExitUsage
	}
	if !c.ownHelp && wantsHelp(args[1:]) {
		fs := newFlagSet(cio, c.name, c.summary)
		fs.SetOutput(cio.stdout)
		config.Bind(fs, cio.getenv, cio.envOptions()...)
		fs.Usage()
		return job.ExitOK
	}
	if code := c.run(ctx, cio, args[1:]); code != exitHelp {
		return code
	}
	return job.ExitOK
}

// exitHelp is parseConfig's code after -h printed the usage: commands
// return it like any other code and dispatch turns it into exit 0.
const exitHelp = -1

// wantsHelp reports -h or --help among the flags (before any "--").
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
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
	fmt.Fprintln(w, "each flag is also a COORDINATOR_* environment variable. coordinator --version prints the build.")
}

// newFlagSet returns a FlagSet for a command. Its -h prints the synopsis,
// the command's own flags, then the configuration flags, each with its type
// and default, on stdout (exit 0); its errors go to stderr.
func newFlagSet(cio cliIO, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("coordinator "+name, flag.ContinueOnError)
	fs.SetOutput(cio.stderr)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "usage: coordinator %s %s\n", name, synopsis)
		var own, cfg []*flag.Flag
		fs.VisitAll(func(f *flag.Flag) {
			if strings.Contains(f.Usage, "$COORDINATOR_") {
				cfg = append(cfg, f)
			} else {
				own = append(own, f)
			}
		})
		if len(own) > 0 {
			fmt.Fprintln(out, "\nflags:")
			printFlags(out, own)
		}
		if len(cfg) > 0 {
			fmt.Fprintln(out, "\nconfiguration flags (each is also the $COORDINATOR_* variable it names; a flag wins):")
			printFlags(out, cfg)
		}
	}
	return fs
}

// printFlags is flag.PrintDefaults for a subset: name, type, usage, and the
// default unless it is the type's zero.
func printFlags(w io.Writer, flags []*flag.Flag) {
	for _, f := range flags {
		typ, usage := flag.UnquoteUsage(f)
		if g, ok := f.Value.(flag.Getter); ok && typ == "value" { // a flag type of ours (base10)
			switch g.Get().(type) {
			case int, int64:
				typ = "int"
			}
		}
		line := "  -" + f.Name
		if typ != "" {
			line += " " + typ
		}
		line += "\n    \t" + strings.ReplaceAll(usage, "\n", "\n    \t")
		switch f.DefValue {
		case "", "0", "false", "0s":
		default:
			line += " (default " + f.DefValue + ")"
		}
		fmt.Fprintln(w, line)
	}
}

// parseConfig binds the shared configuration flags to fs (which may already
// hold the command's own flags), parses args and loads the configuration. On
// error it prints a message naming the variable or flag and returns the exit
// code to use (64; exitHelp after -h); otherwise it returns the positional
// arguments.
func parseConfig(cio cliIO, fs *flag.FlagSet, args []string) (config.Config, []string, int) {
	b := config.Bind(fs, cio.getenv, cio.envOptions()...)
	if wantsHelp(args) {
		fs.SetOutput(cio.stdout)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return config.Config{}, nil, exitHelp
		}
		return config.Config{}, nil, job.ExitUsage // fs already printed the error
	}
	cfg, err := b.Config()
	if err == nil {
		err = checkLockSettings(cfg) // the Redis URL is go-redis' to read
	}
	if err != nil {
		fmt.Fprintf(cio.stderr, "%s: %v\n", fs.Name(), err)
		return config.Config{}, nil, job.ExitUsage
	}
	return cfg, fs.Args(), 0
}

// loadConfig is parseConfig for commands with no flags of their own.
func loadConfig(cio cliIO, name string, args []string) (config.Config, []string, int) {
	return parseConfig(cio, newFlagSet(cio, name, "[flags]"), args)
}

// newLogger builds the process logger from the configuration; it writes to w.
// It is go-redis' logger too (one for the process): go-redis' own lines
// become records like every other.
func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Log.Level))
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if cfg.Log.Format == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	log := slog.New(h).With("replica", cfg.ReplicaID)
	redislock.SetLogger(log)
	return log
}

// versionString is the -ldflags version, else the module version and VCS
// stamp of the build info (commit, time, and +dirty for uncommitted changes).
func versionString() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	v := info.Main.Version
	var rev, at string
	dirty := false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	var extra []string
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if dirty {
			rev += "+dirty"
		}
		extra = append(extra, "commit "+rev)
	}
	if at != "" {
		extra = append(extra, at)
	}
	extra = append(extra, info.GoVersion)
	return v + " (" + strings.Join(extra, ", ") + ")"
}

func init() {
	register(command{name: "version", summary: "print the version (also --version)", run: func(_ context.Context, cio cliIO, _ []string) int {
		fmt.Fprintln(cio.stdout, "coordinator", versionString())
		return 0
	}})
}

package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/kinds"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/replica"
	"github.com/telco-platform/coordinator/internal/telemetry"
)

func init() {
	register(command{name: "run", summary: "KIND [flags]: one owned run (billrun, reaper, ...); JSON result on stdout", run: runRun, ownHelp: true})
}

// kindCall is a parsed `coordinator run|trigger KIND [flags]`.
type kindCall struct {
	reg       *owned.Registry
	kind      owned.Kind
	spec      owned.Spec
	name      string // "run billrun", for messages
	cfg       config.Config
	params    owned.Params
	requestID string
}

// parseKindCall picks the kind args[0] names, parses its flags, the
// request id, more's flags and the configuration, and decodes the kind's
// flags into Params with the kind the configuration makes (a bill run
// admits periods by its billing zone). code != 0 means the command returns
// code (the kinds or -h were printed, or the input was bad).
func parseKindCall(cio cliIO, verb string, args []string, synopsis string, more func(fs *flag.FlagSet)) (kindCall, int) {
	// The kinds' flags do not depend on the configuration: they are bound
	// from the kinds with their defaults, before it is parsed.
	k, code, ok := kindArgs(cio, verb, args, kinds.Config{})
	if !ok {
		return kindCall{}, code
	}
	c := kindCall{spec: owned.Normalize(k.Spec())}
	c.name = verb + " " + c.spec.Command
	fs := newFlagSet(cio, c.name, c.spec.Usage+" [--request-id ID] "+synopsis+"[flags]")
	fields := k.Flags(fs)
	requestID := fs.String("request-id", "", "request id carried by the trigger, its events and its result (default: random)")
	if more != nil {
		more(fs)
	}
	cfg, rest, code := parseConfig(cio, fs, args[1:])
	if code != 0 {
		return kindCall{}, code
	}
	kc := kinds.ConfigOf(cfg)
	if verb == "run" { // the kinds' Workers run in this process
		if err := applyTestHooks(cio.getenv, newLogger(cfg, cio.stderr), &kc); err != nil {
			fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", c.name, err)
			return kindCall{}, job.ExitUsage
		}
	}
	var err error
	if c.reg, err = kc.Registry(); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", c.name, err)
		return kindCall{}, job.ExitFailed
	}
	c.kind, _ = c.reg.ByCommand(c.spec.Command)
	in, err := fields(rest)
	if err == nil {
		c.params, err = c.kind.Decode(in)
	}
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", c.name, err)
		return kindCall{}, job.ExitUsage
	}
	c.cfg, c.requestID = cfg, cmp.Or(*requestID, events.NewID())
	return c, 0
}

// kindArgs picks the kind that `run` or `trigger` names in args[0] among
// kc's kinds, or prints the kinds (exitHelp for -h, else 64). ok false
// means return code.
func kindArgs(cio cliIO, verb string, args []string, kc kinds.Config) (k owned.Kind, code int, ok bool) {
	reg, err := kc.Registry()
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", verb, err)
		return nil, job.ExitFailed, false
	}
	if len(args) > 0 {
		if k, found := reg.ByCommand(args[0]); found {
			return k, 0, true
		}
	}
	w, code := cio.stderr, job.ExitUsage
	if len(args) > 0 && wantsHelp(args[:1]) {
		w, code = cio.stdout, exitHelp
	} else if len(args) > 0 {
		fmt.Fprintf(w, "coordinator %s: unknown kind %q\n", verb, args[0])
	}
	kindUsage(w, verb, reg)
	return nil, code, false
}

func kindUsage(w io.Writer, verb string, reg *owned.Registry) {
	fmt.Fprintf(w, "usage: coordinator %s KIND [flags]  (coordinator %s KIND -h lists KIND's flags)\n\nkinds:\n", verb, verb)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, k := range reg.Kinds() {
		s := owned.Normalize(k.Spec())
		if verb == "trigger" && s.Topic == "" {
			continue
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", s.Command, s.Usage, s.Summary)
	}
	_ = tw.Flush()
}

// runRun is `coordinator run KIND`: one owned run of any registered kind
// through the same template a replica uses. The result is one JSON object
// on stdout, the events JSON lines on stderr, and the exit code of the
// outcome.
func runRun(ctx context.Context, cio cliIO, args []string) int {
	c, code := parseKindCall(cio, "run", args, "", nil)
	if code != 0 {
		return code
	}
	reg, k, spec, name, cfg, p := c.reg, c.kind, c.spec, c.name, c.cfg, c.params
	if err := cfg.RequireDatabase(); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", name, err)
		return job.ExitUsage
	}
	start := time.Now()
	trig := job.Trigger{Source: job.SourceCLI, RequestID: c.requestID, RequestedBy: currentUser()}
	// failed prints the result of a run that could not begin; a failure
	// of a transient cause (Postgres unreachable) is retryable: exit 75.
	failed := func(o job.Outcome, err error) int {
		return printResult(cio, job.Result{Job: spec.Name, Key: k.LockKey(p), Outcome: o, Replica: cfg.ReplicaID,
			RequestID: trig.RequestID, Error: err.Error(), DurationMS: time.Since(start).Milliseconds(),
			Retryable: o == job.OutcomeFailed && owned.IsRetryable(err)})
	}

	// On a terminal a live bar replaces the <job>_progress records; log
	// lines and events pass through it.
	stderr := cio.stderr
	var progress owned.ProgressReporter
	if bar := stderrBar(cio.stderr); bar != nil {
		stderr, progress = bar, bar
	}
	log := newLogger(cfg, stderr)
	if exp := cio.getenv("OTEL_TRACES_EXPORTER"); exp == "console" {
		fmt.Fprintf(cio.stderr, "coordinator %s: OTEL_TRACES_EXPORTER = \"console\": spans would go to stdout, which carries the result; use otlp\n", name)
		return job.ExitUsage
	}
	tel, flush, code := setupTelemetry(ctx, cio, name, cfg, log)
	if code != 0 {
		return code
	}
	defer flush()
	// A caller's trace (TRACEPARENT, the environment carrier) is the run's parent.
	ctx = tel.Extract(ctx, telemetry.HeaderCarrier(func(k string) string { return cio.getenv(strings.ToUpper(k)) }))
	connectCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pool, err := postgres.Connect(connectCtx, cfg.DatabaseURL, int32(cfg.Billrun.Workers+8), postgres.WithTracer(tel.PgxTracer()))
	if err != nil {
		log.Error("run_postgres_unreachable", "error", err)
		return failed(job.OutcomeFailed, err)
	}
	defer pool.Close()
	locker, err := openLocker(ctx, cfg, log, nil)
	var cfgErr *config.Error
	switch {
	case errors.As(err, &cfgErr): // a Redis that may evict lock keys
		fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", name, err)
		return job.ExitUsage
	case err != nil:
		log.Error("run_lock_backend_unavailable", "error", err)
		return failed(job.OutcomeUnavailable, err)
	}
	// Closing the locker does not delete a lock left held for a minimum hold.
	defer func() { _ = locker.Close() }()
	if err := replica.InstrumentLocker(locker, tel, nil); err != nil {
		log.Warn("run_lock_tracing_failed", "error", err)
	}

	runner, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{DB: pool, Locker: locker, Log: log},
		Replica: cfg.ReplicaID, Emit: events.NewJSONLines(stderr), Tracer: tel.TracerIfOn(owned.TracerName),
		Progress: progress, ProgressInterval: cfg.ProgressInterval})
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", name, err)
		return job.ExitUsage
	}
	res := runner.Run(ctx, k, p, trig)
	// A lock kept for a minimum hold goes with the process: its timer would
	// not outlive it, and the lock would stay held until its TTL.
	runner.Close()
	return printResult(cio, res)
}

// printResult writes the run's one JSON object on stdout and returns its exit code.
func printResult(cio cliIO, res job.Result) int {
	b, err := json.Marshal(res)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator run: encode result: %v\n", err)
		return job.ExitFailed
	}
	fmt.Fprintln(cio.stdout, string(b))
	return res.ExitCode()
}

func currentUser() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return ""
}

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

// parseKindCall picks the kind args[0] names and parses its flags, the
// request id, more's flags and the configuration into Params. code != 0
// means the command returns code (the kinds or -h were printed, or the
// input was bad).
func parseKindCall(cio cliIO, verb string, args []string, synopsis string, more func(fs *flag.FlagSet)) (kindCall, int) {
	reg, k, code, ok := kindArgs(cio, verb, args)
	if !ok {
		return kindCall{}, code
	}
	c := kindCall{reg: reg, kind: k, spec: owned.Normalize(k.Spec())}
	c.name = verb + " " + c.spec.Command
	fs := newFlagSet(cio, c.name, c.spec.Usage+" [--request-id ID] "+synopsis+"[flags]")
	build := k.Flags(fs)
	requestID := fs.String("request-id", "", "request id carried by the trigger, its events and its result (default: random)")
	if more != nil {
		more(fs)
	}
	cfg, rest, code := parseConfig(cio, fs, args[1:])
	if code != 0 {
		return kindCall{}, code
	}
	reg.Configure(cfg) // the kind's checks follow the deployment (a bill run's billing zone)
	p, err := build(rest)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", c.name, err)
		return kindCall{}, job.ExitUsage
	}
	c.cfg, c.params, c.requestID = cfg, p, cmp.Or(*requestID, events.NewID())
	return c, 0
}

// kindArgs picks the kind that `run` or `trigger` names in args[0], or
// prints the kinds (exitHelp for -h, else 64). ok false means return code.
func kindArgs(cio cliIO, verb string, args []string) (reg *owned.Registry, k owned.Kind, code int, ok bool) {
	reg, err := kinds.Registry()
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", verb, err)
		return nil, nil, job.ExitFailed, false
	}
	if len(args) > 0 {
		if k, found := reg.ByCommand(args[0]); found {
			return reg, k, 0, true
		}
	}
	w, code := cio.stderr, job.ExitUsage
	if len(args) > 0 && wantsHelp(args[:1]) {
		w, code = cio.stdout, exitHelp
	} else if len(args) > 0 {
		fmt.Fprintf(w, "coordinator %s: unknown kind %q\n", verb, args[0])
	}
	kindUsage(w, verb, reg)
	return nil, nil, code, false
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
	failed := func(o job.Outcome, err error) int {
		return printResult(cio, job.Result{Job: spec.Name, Key: k.LockKey(p), Outcome: o, Replica: cfg.ReplicaID,
			RequestID: trig.RequestID, Error: err.Error(), DurationMS: time.Since(start).Milliseconds()})
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
	pool, err := postgres.Connect(connectCtx, cfg.DatabaseURL, int32(cfg.BillrunWorkers+8), postgres.WithTracer(tel.PgxTracer()))
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

	if err := applyTestHooks(cio.getenv, log, reg, nil); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", name, err)
		return job.ExitUsage
	}
	runner, err := owned.NewRunner(reg, owned.Deps{Config: cfg, DB: pool, Locker: locker, Log: log, Telemetry: tel,
		Progress: progress}, events.NewJSONLines(stderr))
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", name, err)
		return job.ExitUsage
	}
	return printResult(cio, runner.Run(ctx, k, p, trig))
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

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
)

func init() {
	register(command{name: "locks", summary: "[--json]: list the locks held now", run: runLocks, ownHelp: true})
}

func runLocks(ctx context.Context, cio cliIO, args []string) int {
	fs := newFlagSet(cio, "locks", "[--json] [flags]")
	asJSON := jsonFlag(fs)
	cfg, extra, code := parseConfig(cio, fs, args)
	if code != 0 {
		return code
	}
	if len(extra) > 0 {
		fmt.Fprintf(cio.stderr, "coordinator locks: unexpected arguments %q\nusage: coordinator locks [--json] [config flags]\n", extra)
		return job.ExitUsage
	}
	log := newLogger(cfg, cio.stderr)
	locker, err := openLocker(ctx, cfg, log, nil)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator locks: %v\n", err)
		return job.ExitUsage
	}
	defer locker.Close()
	insp, ok := locker.(ownership.Inspector)
	if !ok {
		fmt.Fprintln(cio.stderr, "coordinator locks: this lock backend cannot list its locks")
		return job.ExitUnavailable
	}
	qctx, cancel := context.WithTimeout(ctx, cfg.Lock.WaitTime+time.Second)
	defer cancel()
	locks, err := insp.Locks(qctx)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator locks: %v\n", err)
		return job.ExitUnavailable
	}
	if *asJSON {
		if locks == nil {
			locks = []ownership.LockInfo{}
		}
		return printJSON(cio, locks)
	}
	tw := tabwriter.NewWriter(cio.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tOWNER\tFENCE\tHOLDS\tTTL")
	for _, l := range locks {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", l.Key, l.Owner, l.Fence, l.Holds, l.TTL.Round(time.Millisecond))
	}
	_ = tw.Flush()
	return 0
}

// jsonFlag is the one output flag of the commands that print state (locks,
// watch, migrate status): --json prints JSON instead of a table, a snapshot
// as one array, a stream as one object per line.
func jsonFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("json", false, "print JSON instead of a table (a list as one array; watch: one event per line)")
}

// printJSON writes v as one line of JSON.
func printJSON(cio cliIO, v any) int {
	if err := json.NewEncoder(cio.stdout).Encode(v); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator: encode: %v\n", err)
		return job.ExitFailed
	}
	return job.ExitOK
}

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
)

func init() {
	register(command{name: "locks", summary: "[--json]: list the locks held now", run: runLocks})
}

func runLocks(ctx context.Context, cio cliIO, args []string) int {
	asJSON := false
	var rest []string
	for _, a := range args {
		if a == "--json" || a == "-json" {
			asJSON = true
			continue
		}
		rest = append(rest, a)
	}
	cfg, extra, code := loadConfig(cio, "locks", rest)
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
	qctx, cancel := context.WithTimeout(ctx, cfg.LockWaitTime+time.Second)
	defer cancel()
	locks, err := insp.Locks(qctx)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator locks: %v\n", err)
		return job.ExitUnavailable
	}
	if asJSON {
		if locks == nil {
			locks = []ownership.LockInfo{}
		}
		enc := json.NewEncoder(cio.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(locks); err != nil {
			return job.ExitFailed
		}
		return 0
	}
	tw := tabwriter.NewWriter(cio.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tOWNER\tFENCE\tHOLDS\tTTL")
	for _, l := range locks {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", l.Key, l.Owner, l.Fence, l.Holds, l.TTL.Round(time.Millisecond))
	}
	_ = tw.Flush()
	return 0
}

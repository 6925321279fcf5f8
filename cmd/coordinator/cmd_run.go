package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/telco-platform/coordinator/internal/job"
)

// runJobs holds the jobs `coordinator run` knows; each cmd_run_*.go file
// adds its own in init.
var runJobs = map[string]func(ctx context.Context, cio cliIO, args []string) int{}

func init() {
	register(command{name: "run", summary: "billrun --period P | reaper: one owned run, JSON result on stdout", run: runRun})
}

func runRun(ctx context.Context, cio cliIO, args []string) int {
	if len(args) == 0 || runJobs[args[0]] == nil {
		names := make([]string, 0, len(runJobs))
		for n := range runJobs {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(cio.stderr, "usage: coordinator run %s [flags]\n", strings.Join(names, "|"))
		return job.ExitUsage
	}
	return runJobs[args[0]](ctx, cio, args[1:])
}

// printResult writes the run's one JSON object on stdout and returns its exit code.
func printResult(cio cliIO, res job.Result) int {
	b, err := json.Marshal(res)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator run: encode result: %v\n", err)
		return job.ExitFailed
	}
	fmt.Fprintln(cio.stdout, string(b))
	return res.Outcome.ExitCode()
}

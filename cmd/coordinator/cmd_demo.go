package main

import (
	"context"
	"fmt"

	"github.com/telco-platform/coordinator/internal/job"
)

func init() {
	register(command{name: "demo", summary: "moved: the demo is its own program, coordinator-demo (`make demo`)", run: runDemo})
}

// runDemo says where the demo went: it is a program of its own
// (cmd/coordinator-demo), so that the production binary carries neither the
// demo nor the in-process Kafka it starts.
func runDemo(_ context.Context, cio cliIO, _ []string) int {
	fmt.Fprintln(cio.stderr, "coordinator demo: the demo is its own program now: run `make demo`, or `go run ./cmd/coordinator-demo` (-h lists its flags)")
	return job.ExitUsage
}

package msisdnreaper

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// TestSweeper runs the sweep kind through the owned template, as a replica
// does, with the locker's owner as the replica id.
type TestSweeper struct {
	runner *owned.Runner
	kind   owned.Kind
}

// NewTestSweeper opens the sweep kind with cfg; it panics on a bad cfg
// (TestSweepRejectsInvalidConfig checks those).
func NewTestSweeper(db *pgxpool.Pool, locker ownership.Locker, emit events.Emitter, cfg Config) *TestSweeper {
	k := NewSweepKind(cfg)
	reg, err := owned.NewRegistry(k)
	if err != nil {
		panic(err)
	}
	r, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{DB: db, Locker: locker}, Emit: emit})
	if err != nil {
		panic(err)
	}
	return &TestSweeper{runner: r, kind: k}
}

// Sweep is one owned sweep to its end.
func (s *TestSweeper) Sweep(ctx context.Context, t job.Trigger) job.Result {
	return s.runner.Run(ctx, s.kind, sweep(s.kind), t)
}

// sweep are the Params of a sweep of k (the reaper's kind) with no
// override.
func sweep(k owned.Kind) owned.Params {
	p, err := owned.NewParams(k, sweepParams{})
	if err != nil {
		panic(err)
	}
	return p
}

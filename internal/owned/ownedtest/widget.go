// Package ownedtest has a kind of owned run for the tests of the template
// and of the transports, so that they test themselves apart from any job:
// Widget, whose work each test chooses.
package ownedtest

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"sync"
	"time"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
)

// Params are a widget run's: trigger {"n": N}.
type Params struct {
	N int `json:"n"`
}

// Widget is a kind: trigger {"n": N} (N >= 1, else rejected with reason
// bad_n), lock key NAME:N, Kafka topic test.NAME.requested (record key N),
// HTTP path /v1/NAME, `--n` on the CLI.
type Widget struct {
	// Name is the kind's name. Default "widget".
	Name string
	// Lease is how its lock is held. Default watchdog, released at once.
	Lease owned.Lease
	// Schedule is its cron spec. Default none.
	Schedule string
	// Work is the run's work; nil completes with counts {"n": N}.
	Work func(ctx context.Context, r *owned.Run, n int) (owned.Report, error)
	// Claim, when set, makes the Worker a Claimer.
	Claim func(ctx context.Context, r *owned.Run, n int) (int64, error)
	// AlreadyCompleted, when set with Claim, makes the Worker a
	// CompletedChecker too.
	AlreadyCompleted func(ctx context.Context, r *owned.Run, n int) (*owned.CompletedError, error)
	// Incomplete, when set (and Claim is not), makes the Worker a
	// Resumable listing these runs.
	Incomplete func(ctx context.Context) ([]owned.Incomplete, error)

	mu       sync.Mutex
	runs     int
	observed []job.Result
}

var (
	_ owned.Kind        = (*Widget)(nil)
	_ owned.RecordKeyed = (*Widget)(nil)
)

func (w *Widget) name() string { return cmp.Or(w.Name, "widget") }

// Topic is the widget's trigger topic (before any prefix).
func (w *Widget) Topic() string { return "test." + w.name() + ".requested" }

func (w *Widget) Spec() owned.Spec {
	return owned.Spec{Name: w.name(), Summary: "a test kind", Usage: "--n N", Topic: w.Topic(), HTTPPath: "/v1/" + w.name()}
}

func (w *Widget) Decode(in owned.Input) (owned.Params, error) {
	var p Params
	if err := in.Decode(&p); err != nil {
		return nil, err
	}
	if p.N < 1 {
		return nil, owned.Reject("bad_n", "n = %d: must be at least 1", p.N)
	}
	return p, nil
}

func (w *Widget) Encode(p owned.Params) ([]byte, map[string]any) {
	n := p.(Params).N
	return []byte(fmt.Sprint(n)), map[string]any{"n": n}
}

func (w *Widget) Flags(fs *flag.FlagSet) func([]string) (owned.Params, error) {
	n := fs.Int("n", 1, "which widget")
	return func(args []string) (owned.Params, error) {
		if len(args) > 0 || *n < 1 {
			return nil, job.BadInput("want --n N (N >= 1), got --n %d and %q", *n, args)
		}
		return Params{N: *n}, nil
	}
}

func (w *Widget) LockKey(p owned.Params) string { return fmt.Sprintf("%s:%d", w.name(), p.(Params).N) }

// LockKeyOfRecord: a widget record's key is its number.
func (w *Widget) LockKeyOfRecord(key []byte) (string, bool) {
	if len(key) == 0 {
		return "", false
	}
	return w.name() + ":" + string(key), true
}

func (w *Widget) Open(owned.Deps) (owned.Worker, error) {
	switch {
	case w.Claim != nil && w.AlreadyCompleted != nil:
		return checkingWorker{claimingWorker{worker{w}}}, nil
	case w.Claim != nil:
		return claimingWorker{worker{w}}, nil
	case w.Incomplete != nil:
		return resumableWorker{worker{w}}, nil
	}
	return worker{w}, nil
}

// Runs is how many times the work ran.
func (w *Widget) Runs() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.runs
}

// Results are what the Observer saw, in order.
func (w *Widget) Results() []job.Result {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]job.Result(nil), w.observed...)
}

type worker struct{ w *Widget }

var (
	_ owned.Leaser    = worker{}
	_ owned.Scheduler = worker{}
	_ owned.Observer  = worker{}
)

func (k worker) Run(ctx context.Context, r *owned.Run, p owned.Params) (owned.Report, error) {
	k.w.mu.Lock()
	k.w.runs++
	k.w.mu.Unlock()
	n := p.(Params).N
	if k.w.Work == nil {
		return owned.Report{Counts: map[string]int64{"n": int64(n)}}, nil
	}
	return k.w.Work(ctx, r, n)
}

func (k worker) Lease(owned.Params) owned.Lease { return k.w.Lease }

func (k worker) Schedule() string { return k.w.Schedule }

func (k worker) Tick(time.Time) (owned.Params, error) { return Params{N: 1}, nil }

func (k worker) Observe(res job.Result) {
	k.w.mu.Lock()
	defer k.w.mu.Unlock()
	k.w.observed = append(k.w.observed, res)
}

type claimingWorker struct{ worker }

func (k claimingWorker) Claim(ctx context.Context, r *owned.Run, p owned.Params) (int64, error) {
	return k.w.Claim(ctx, r, p.(Params).N)
}

type checkingWorker struct{ claimingWorker }

func (k checkingWorker) AlreadyCompleted(ctx context.Context, r *owned.Run, p owned.Params) (*owned.CompletedError, error) {
	return k.w.AlreadyCompleted(ctx, r, p.(Params).N)
}

// Gated is Work that waits until gate closes (completed) or the run's
// context ends (its error).
func Gated(gate <-chan struct{}) func(ctx context.Context, r *owned.Run, n int) (owned.Report, error) {
	return func(ctx context.Context, _ *owned.Run, n int) (owned.Report, error) {
		select {
		case <-gate:
			return owned.Report{Counts: map[string]int64{"n": int64(n)}}, nil
		case <-ctx.Done():
			return owned.Report{}, ctx.Err()
		}
	}
}

type resumableWorker struct{ worker }

func (k resumableWorker) Incomplete(ctx context.Context) ([]owned.Incomplete, error) {
	return k.w.Incomplete(ctx)
}

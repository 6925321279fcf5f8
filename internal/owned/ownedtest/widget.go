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

	"github.com/telco-platform/coordinator/internal/base10"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
)

// Params are a widget run's: trigger {"n": N}.
type Params struct {
	N int `json:"n"`
}

// Widget is a kind (Kind): trigger {"n": N} (N >= 1, else rejected with
// reason bad_n), lock key NAME:N, Kafka topic test.NAME.requested (record
// key N), HTTP path /v1/NAME, `--n` on the CLI.
type Widget struct {
	// Name is the kind's name. Default "widget".
	Name string
	// Lease is how its lock is held. Default watchdog, released at once.
	Lease owned.Lease
	// Schedule is its cron spec. Default none.
	Schedule string
	// Work is the run's work; nil completes with counts {"n": N}.
	Work func(ctx context.Context, r *owned.Run, n int) (owned.Report, error)
	// Claim, when set, gives the Worker a Claim.
	Claim func(ctx context.Context, r *owned.Run, n int) (int64, error)
	// AlreadyCompleted, when set with Claim, gives the Worker an
	// AlreadyCompleted: the look before the lock.
	AlreadyCompleted func(ctx context.Context, r *owned.Run, n int) (*owned.CompletedError, error)
	// Incomplete, when set, makes the kind resumable, listing these runs.
	Incomplete func(ctx context.Context) ([]owned.Incomplete[Params], error)

	once     sync.Once
	kind     owned.Kind
	mu       sync.Mutex
	runs     int
	observed []job.Result
}

func (w *Widget) name() string { return cmp.Or(w.Name, "widget") }

// Topic is the widget's trigger topic (before any prefix).
func (w *Widget) Topic() string { return "test." + w.name() + ".requested" }

// Kind is the widget as a kind of owned run (the same value every call).
// Set the fields before the first call.
func (w *Widget) Kind() owned.Kind {
	w.once.Do(func() {
		w.kind = owned.Define(owned.Def[Params]{
			Spec: owned.Spec{Name: w.name(), Summary: "a test kind", Usage: "--n N", Topic: w.Topic(), HTTPPath: "/v1/" + w.name()},
			Decode: func(in owned.Input) (Params, error) {
				var p Params
				if err := in.Decode(&p); err != nil {
					return p, err
				}
				if p.N < 1 {
					return p, owned.Reject("bad_n", "n = %d: must be at least 1", p.N)
				}
				return p, nil
			},
			Encode: func(p Params) ([]byte, map[string]any) {
				return []byte(fmt.Sprint(p.N)), map[string]any{"n": p.N}
			},
			Flags: func(fs *flag.FlagSet) func([]string) (map[string]any, error) {
				n := base10.Int(fs, "n", 1, "which widget")
				return func(args []string) (map[string]any, error) {
					if len(args) > 0 {
						return nil, job.BadInput("want --n N, got arguments %q", args)
					}
					return map[string]any{"n": *n}, nil
				}
			},
			LockKey: func(p Params) string { return fmt.Sprintf("%s:%d", w.name(), p.N) },
			// A widget record's key is its number.
			RecordLockKey: func(key []byte) (string, bool) {
				if len(key) == 0 {
					return "", false
				}
				return w.name() + ":" + string(key), true
			},
			Open: func(owned.Deps) (owned.Worker[Params], error) { return w.worker(), nil },
		})
	})
	return w.kind
}

func (w *Widget) worker() owned.Worker[Params] {
	wk := owned.Worker[Params]{
		Run: func(ctx context.Context, r *owned.Run, p Params) (owned.Report, error) {
			w.mu.Lock()
			w.runs++
			w.mu.Unlock()
			if w.Work == nil {
				return owned.Report{Counts: map[string]int64{"n": int64(p.N)}}, nil
			}
			return w.Work(ctx, r, p.N)
		},
		Lease:    func(Params) owned.Lease { return w.Lease },
		Schedule: w.Schedule,
		Tick:     func(time.Time) (Params, error) { return Params{N: 1}, nil },
		Observe: func(res job.Result) {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.observed = append(w.observed, res)
		},
	}
	if w.Claim != nil {
		wk.Claim = func(ctx context.Context, r *owned.Run, p Params) (int64, error) { return w.Claim(ctx, r, p.N) }
		if w.AlreadyCompleted != nil {
			wk.AlreadyCompleted = func(ctx context.Context, r *owned.Run, p Params) (*owned.CompletedError, error) {
				return w.AlreadyCompleted(ctx, r, p.N)
			}
		}
	} else if w.Incomplete != nil {
		wk.Incomplete = w.Incomplete
	}
	return wk
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

// Params are the Params of a widget run n (what Decode makes of {"n": n}).
func (w *Widget) Params(n int) owned.Params {
	p, err := owned.NewParams(w.Kind(), Params{N: n})
	if err != nil {
		panic(err) // the widget's own kind takes its own Params
	}
	return p
}

package owned_test

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"time"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
)

// widget is a kind of the tests' own: params {"n": N}, lock key widget:N.
// What its Worker does is up to each test.
type widget struct {
	name  string
	lease owned.Lease
	// run is the work; nil completes with counts {"n": N}.
	run func(ctx context.Context, r *owned.Run, n int) (owned.Report, error)
	// claim, when set, makes the Worker a Claimer.
	claim func(ctx context.Context, r *owned.Run, n int) (int64, error)

	mu       sync.Mutex
	ran      int
	observed []job.Result
}

type widgetParams struct {
	N int `json:"n"`
}

func (w *widget) Spec() owned.Spec {
	return owned.Spec{Name: w.name, Summary: "a test kind", Topic: "test." + w.name, HTTPPath: "/v1/" + w.name}
}

func (w *widget) Decode(in owned.Input) (owned.Params, error) {
	var p widgetParams
	if err := in.Decode(&p); err != nil {
		return nil, err
	}
	if p.N < 1 {
		return nil, owned.Reject("bad_n", "n = %d: must be at least 1", p.N)
	}
	return p, nil
}

func (w *widget) Encode(p owned.Params) ([]byte, map[string]any) {
	return nil, map[string]any{"n": p.(widgetParams).N}
}

func (w *widget) Flags(fs *flag.FlagSet) func([]string) (owned.Params, error) {
	n := fs.Int("n", 1, "which widget")
	return func([]string) (owned.Params, error) { return widgetParams{N: *n}, nil }
}

func (w *widget) LockKey(p owned.Params) string {
	return fmt.Sprintf("%s:%d", w.name, p.(widgetParams).N)
}

func (w *widget) Open(owned.Deps) (owned.Worker, error) {
	if w.claim != nil {
		return newClaimingWorker(w), nil
	}
	return worker{w}, nil
}

func (w *widget) runs() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ran
}

func (w *widget) results() []job.Result {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]job.Result(nil), w.observed...)
}

type worker struct{ w *widget }

func (k worker) Run(ctx context.Context, r *owned.Run, p owned.Params) (owned.Report, error) {
	k.w.mu.Lock()
	k.w.ran++
	k.w.mu.Unlock()
	n := p.(widgetParams).N
	if k.w.run == nil {
		return owned.Report{Counts: map[string]int64{"n": int64(n)}}, nil
	}
	return k.w.run(ctx, r, n)
}

func (k worker) Lease(owned.Params) owned.Lease { return k.w.lease }

func (k worker) Observe(res job.Result) {
	k.w.mu.Lock()
	defer k.w.mu.Unlock()
	k.w.observed = append(k.w.observed, res)
}

type claimingWorker struct{ worker }

func newClaimingWorker(w *widget) claimingWorker { return claimingWorker{worker{w}} }

func (k claimingWorker) Claim(ctx context.Context, r *owned.Run, p owned.Params) (int64, error) {
	return k.w.claim(ctx, r, p.(widgetParams).N)
}

func types(evs []events.Event) []events.Type {
	out := make([]events.Type, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// waitCtx waits for ctx to end, or fails the run after a bound that no
// passing test reaches.
func waitCtx(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("stopped: %w", context.Cause(ctx))
	case <-time.After(30 * time.Second):
		return fmt.Errorf("test: the run was never stopped")
	}
}

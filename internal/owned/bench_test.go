package owned_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// BenchmarkRunAcquireRelease: one owned run of a kind with no work on the
// Redis lock per op (acquire, ownership.acquired, run.completed, release,
// ownership.released; events to a no-op sink), uncontended, each goroutine
// on its own key. The template's whole cost around a lock pair, with
// tracing off. It uses only what the template had before issue 17, so the
// same file measures the code before it (BENCHMARKS.md, observability).
func BenchmarkRunAcquireRelease(b *testing.B) {
	for _, g := range []int{1, 16} {
		b.Run("goroutines="+strconv.Itoa(g), func(b *testing.B) {
			env := testenv.Redis(b)
			client, err := redislock.NewClient(env.URL, redislock.ModeSingle)
			if err != nil {
				b.Fatal(err)
			}
			l, err := redislock.New(client, redislock.Config{Prefix: env.Prefix, Owner: "bench", WaitTime: 30 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = l.Close(); _ = client.Close() })
			w := &ownedtest.Widget{}
			reg, err := owned.NewRegistry(w.Kind())
			if err != nil {
				b.Fatal(err)
			}
			r, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{Locker: l}, Replica: "bench",
				Emit: events.EmitterFunc(func(context.Context, events.Event) {})})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			for i := range g { // warm the connections and the script cache
				r.Run(ctx, w.Kind(), w.Params(i+1), job.Trigger{Source: job.SourceCLI})
			}
			b.ResetTimer()
			var wg sync.WaitGroup
			per := (b.N + g - 1) / g
			for i := range g {
				wg.Go(func() {
					for range per {
						if res := r.Run(ctx, w.Kind(), w.Params(i+1), job.Trigger{Source: job.SourceCLI}); res.Outcome != job.OutcomeCompleted {
							b.Error(res.Outcome, res.Error)
							return
						}
					}
				})
			}
			wg.Wait()
		})
	}
}

package owned_test

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
)

func TestWidgetConformance(t *testing.T) {
	t.Parallel()
	w := &ownedtest.Widget{}
	ownedtest.CheckKind(t, w.Kind(),
		ownedtest.Case{Name: "n", Fields: map[string]any{"n": 3}, Key: []byte("3"), Args: []string{"--n", "3"}},
		ownedtest.Case{Name: "n without a key", Fields: map[string]any{"n": 1}, Args: []string{}},
		ownedtest.Case{Name: "n zero", Fields: map[string]any{"n": 0}, Args: []string{"--n", "0"}, Reason: "bad_n"},
	)
}

// recorder is a testing.TB that keeps what CheckKind reports.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

// check runs CheckKind on k with the case and returns what it reported.
func check(t *testing.T, k owned.Kind, c ownedtest.Case) string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ownedtest.CheckKind(r, k, c)
	}()
	<-done
	return strings.Join(r.errors, "\n")
}

// p is a test kind's params.
type p struct {
	N int `json:"n"`
}

// broken is a kind that is right but for what change does to its Def and
// Worker.
func broken(change func(*owned.Def[p], *owned.Worker[p])) owned.Kind {
	d := owned.Def[p]{
		Spec: owned.Spec{Name: "broken", Topic: "test.broken", HTTPPath: "/v1/broken"},
		Decode: func(in owned.Input) (p, error) {
			var v p
			return v, in.Decode(&v)
		},
		Encode:  func(v p) ([]byte, map[string]any) { return nil, map[string]any{"n": v.N} },
		Flags:   nil,
		LockKey: func(v p) string { return fmt.Sprintf("broken:%d", v.N) },
	}
	w := owned.Worker[p]{Run: func(context.Context, *owned.Run, p) (owned.Report, error) { return owned.Report{}, nil }}
	change(&d, &w)
	d.Open = func(owned.Deps) (owned.Worker[p], error) { return w, nil }
	return owned.Define(d)
}

// CheckKind fails the kinds it is meant to catch, each for its reason.
func TestCheckKindCatchesBrokenKinds(t *testing.T) {
	t.Parallel()
	ok := ownedtest.Case{Name: "n", Fields: map[string]any{"n": 2}}
	require.Empty(t, check(t, broken(func(*owned.Def[p], *owned.Worker[p]) {}), ok), "the unbroken kind passes")
	for _, tc := range []struct {
		name   string
		change func(*owned.Def[p], *owned.Worker[p])
		c      ownedtest.Case
		want   string
	}{
		{"lock key outside its namespace", func(d *owned.Def[p], _ *owned.Worker[p]) {
			d.LockKey = func(p) string { return "billrun:2026-11" }
		}, ok, "outside the kind's namespace"},
		{"Encode is not Decode's inverse", func(d *owned.Def[p], _ *owned.Worker[p]) {
			d.Encode = func(v p) ([]byte, map[string]any) { return nil, map[string]any{"n": v.N + 1} }
		}, ok, "do not round-trip"},
		{"flags ask for another run", func(d *owned.Def[p], _ *owned.Worker[p]) {
			d.Flags = func(*flag.FlagSet) func([]string) (map[string]any, error) {
				return func([]string) (map[string]any, error) { return map[string]any{"n": 7}, nil }
			}
		}, ownedtest.Case{Name: "n", Fields: map[string]any{"n": 2}, Args: []string{}}, "the CLI's"},
		{"Status without StatusID", func(_ *owned.Def[p], w *owned.Worker[p]) {
			w.Status = func(context.Context, string) (any, error) { return nil, nil }
		}, ok, "Def.StatusID is not set"},
		{"Schedule without Tick", func(_ *owned.Def[p], w *owned.Worker[p]) { w.Schedule = "@every 1m" }, ok, "no Tick"},
		{"AlreadyCompleted without Claim", func(_ *owned.Def[p], w *owned.Worker[p]) {
			w.AlreadyCompleted = func(context.Context, *owned.Run, p) (*owned.CompletedError, error) { return nil, nil }
		}, ok, "AlreadyCompleted and no Claim"},
		{"HTTP takes unknown fields", func(d *owned.Def[p], _ *owned.Worker[p]) {
			d.Decode = func(owned.Input) (p, error) { return p{N: 2}, nil }
		}, ok, "unknown field is not refused"},
		{"a rejection that one source accepts", func(*owned.Def[p], *owned.Worker[p]) {},
			ownedtest.Case{Name: "bad", Fields: map[string]any{"n": 2}, Reason: "bad_n"}, "accepts bad input"},
	} {
		require.Contains(t, check(t, broken(tc.change), tc.c), tc.want, tc.name)
	}
}

package owned_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// greeting is the typed parameters of a run of the greet kind.
type greeting struct {
	Name string `json:"name"`
}

// A complete kind: its parameters, how every trigger source (Kafka, HTTP,
// the CLI's flags) becomes them, its lock key, and its work. Run through
// the template on the in-memory Locker.
func ExampleDefine() {
	kind := owned.Define(owned.Def[greeting]{
		Spec: owned.Spec{Name: "greet", Summary: "greet someone", Usage: "--name NAME", HTTPPath: "/v1/greetings"},
		Decode: func(in owned.Input) (greeting, error) { // judges every source's input, once
			var g greeting
			if err := in.Decode(&g); err != nil {
				return g, err
			}
			if g.Name == "" {
				return g, owned.Reject("missing_name", "name is required")
			}
			return g, nil
		},
		Encode: func(g greeting) ([]byte, map[string]any) { return nil, map[string]any{"name": g.Name} },
		Flags: func(fs *flag.FlagSet) func([]string) (map[string]any, error) {
			name := fs.String("name", "", "who to greet")
			return func([]string) (map[string]any, error) { return map[string]any{"name": *name}, nil }
		},
		LockKey: func(g greeting) string { return "greet:" + g.Name },
		Open: func(owned.Deps) (owned.Worker[greeting], error) {
			return owned.Worker[greeting]{Run: func(_ context.Context, _ *owned.Run, g greeting) (owned.Report, error) {
				fmt.Println("hello,", g.Name)
				return owned.Report{Counts: map[string]int64{"greeted": 1}}, nil
			}}, nil
		},
	})
	reg, _ := owned.NewRegistry(kind)
	locker := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a"})
	defer locker.Close()
	runner, _ := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{Locker: locker}})

	body := func(s string) owned.Input { // an HTTP body's fields
		var fields map[string]json.RawMessage
		_ = json.Unmarshal([]byte(s), &fields)
		return owned.NewInput(job.SourceHTTP, nil, fields, true)
	}
	_, err := kind.Decode(body(`{}`))
	fmt.Println(err)
	p, _ := kind.Decode(body(`{"name":"Ada"}`))
	res := runner.Run(context.Background(), kind, p, job.Trigger{Source: job.SourceHTTP, RequestID: "r-1"})
	fmt.Println(res.Outcome, res.Key, res.Owner, res.Counts["greeted"])
	// Output:
	// rejected (missing_name): name is required
	// hello, Ada
	// completed greet:Ada replica-a 1
}

package owned

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/telco-platform/coordinator/internal/job"
)

// Params are one run's parameters as the transports carry them: made by a
// kind's Decode (or Tick, or the resumer's decode of a recorded request)
// and read by that kind alone. A transport never looks inside; the
// template gives them back to the kind that made them, typed.
type Params struct {
	kind string // the Spec.Name of the kind that made them
	v    any
}

// Kind is a kind of owned run as the registry, the template and every
// transport see it: its Spec, how a trigger becomes Params, and its lock
// key. A kind package makes one with Define; it is listed once in
// internal/kinds.
type Kind interface {
	// Spec names the kind and its trigger endpoints.
	Spec() Spec
	// Decode turns a trigger's fields into Params (Def.Decode).
	Decode(in Input) (Params, error)
	// RejectReasons are the reasons Decode rejects with besides
	// SharedRejectReasons (Def.RejectReasons).
	RejectReasons() []string
	// Encode is the record key and fields of a trigger asking for p.
	Encode(p Params) (key []byte, fields map[string]any, err error)
	// Flags adds the kind's flags to fs and returns what turns them, once
	// fs is parsed, into the Input Decode judges (Source job.SourceCLI).
	Flags(fs *flag.FlagSet) func(args []string) (Input, error)
	// LockKey is the ownership key of a run with p; "" for Params of
	// another kind.
	LockKey(p Params) string
	// LockKeyOfRecord is the lock key a Kafka record key names, if the kind
	// can read one (Def.RecordLockKey).
	LockKeyOfRecord(recordKey []byte) (string, bool)
	// StatusID is the run id of p for GET HTTPPath/{id}; false when the
	// kind keeps no run state (Def.StatusID).
	StatusID(p Params) (string, bool)
	// HasStatus reports whether GET HTTPPath/{id} answers for this kind.
	HasStatus() bool

	// check and open are the template's: only Define makes a Kind.
	check() error
	open(d Deps) (*worker, error)
}

// Define makes the Kind that d describes. The registry reports what is
// missing from d (NewRegistry); the template checks the Worker that Open
// returns against d (NewRunner, CheckOpen).
func Define[P any](d Def[P]) Kind { return &def[P]{d: d} }

type def[P any] struct{ d Def[P] }

func (k *def[P]) Spec() Spec { return Normalize(k.d.Spec) }

func (k *def[P]) wrap(v P) Params { return Params{kind: k.d.Spec.Name, v: v} }

// params gives back the P that k made; an error for Params of another kind.
func (k *def[P]) params(p Params) (P, error) {
	v, ok := p.v.(P)
	if !ok || p.kind != k.d.Spec.Name {
		var zero P
		if p.kind == "" {
			return zero, fmt.Errorf("owned: kind %q given no params", k.d.Spec.Name)
		}
		return zero, fmt.Errorf("owned: kind %q given the params of kind %q", k.d.Spec.Name, p.kind)
	}
	return v, nil
}

func (k *def[P]) RejectReasons() []string { return k.d.RejectReasons }

func (k *def[P]) Decode(in Input) (Params, error) {
	v, err := k.d.Decode(in)
	if err != nil {
		return Params{}, err
	}
	return k.wrap(v), nil
}

func (k *def[P]) Encode(p Params) ([]byte, map[string]any, error) {
	v, err := k.params(p)
	if err != nil {
		return nil, nil, err
	}
	if k.d.Encode == nil {
		return nil, nil, fmt.Errorf("owned: kind %q has no Encode", k.d.Spec.Name)
	}
	key, fields := k.d.Encode(v)
	return key, fields, nil
}

func (k *def[P]) Flags(fs *flag.FlagSet) func([]string) (Input, error) {
	var fields func([]string) (map[string]any, error)
	if k.d.Flags != nil {
		fields = k.d.Flags(fs)
	}
	return func(args []string) (Input, error) {
		var m map[string]any
		switch {
		case fields != nil:
			var err error
			if m, err = fields(args); err != nil {
				return Input{}, err
			}
		case len(args) > 0:
			return Input{}, job.BadInput("unexpected arguments %q", args)
		}
		raw := make(map[string]json.RawMessage, len(m))
		for name, v := range m {
			b, err := json.Marshal(v)
			if err != nil {
				return Input{}, fmt.Errorf("owned: kind %q: flag field %q: %w", k.d.Spec.Name, name, err)
			}
			raw[name] = b
		}
		return NewInput(job.SourceCLI, nil, raw, true), nil
	}
}

func (k *def[P]) LockKey(p Params) string {
	v, err := k.params(p)
	if err != nil {
		return ""
	}
	return k.d.LockKey(v)
}

func (k *def[P]) LockKeyOfRecord(key []byte) (string, bool) {
	if k.d.RecordLockKey == nil {
		return "", false
	}
	return k.d.RecordLockKey(key)
}

func (k *def[P]) StatusID(p Params) (string, bool) {
	v, err := k.params(p)
	if err != nil || k.d.StatusID == nil {
		return "", false
	}
	return k.d.StatusID(v), true
}

func (k *def[P]) HasStatus() bool { return k.d.StatusID != nil }

func (k *def[P]) check() error {
	d := k.d
	var missing []string
	for _, f := range []struct {
		name string
		nil  bool
	}{{"Decode", d.Decode == nil}, {"LockKey", d.LockKey == nil}, {"Open", d.Open == nil}} {
		if f.nil {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("owned: kind %q: Def has no %v", d.Spec.Name, missing)
	}
	if d.Spec.Topic != "" && d.Encode == nil {
		return fmt.Errorf("owned: kind %q has a Topic and no Encode (`coordinator trigger` sends Encode's fields)", d.Spec.Name)
	}
	return nil
}

// worker is a Worker[P] as the template holds it: every function takes
// Params, given back to the kind as its P.
type worker struct {
	run         func(ctx context.Context, run *Run, p Params) (Report, error)
	lease       func(p Params) Lease
	claim       func(ctx context.Context, run *Run, p Params) (int64, error)
	completed   func(ctx context.Context, run *Run, p Params) (*CompletedError, error)
	schedule    string
	tick        func(at time.Time) (Params, error)
	status      func(ctx context.Context, id string) (any, error)
	observe     func(res job.Result)
	incomplete  func(ctx context.Context) ([]Incomplete[Params], error)
	records     func(p Params) bool
	published   func(ctx context.Context, p Params, fence int64) error
	unpublished func(ctx context.Context, olderThan time.Duration, limit int) ([]Completion[Params], error)
}

func (k *def[P]) open(d Deps) (*worker, error) {
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	w, err := k.d.Open(d)
	if err != nil {
		return nil, err
	}
	if err := k.checkWorker(w); err != nil {
		return nil, err
	}
	out := &worker{schedule: w.Schedule, status: w.Status, observe: w.Observe}
	out.run = func(ctx context.Context, run *Run, p Params) (Report, error) {
		v, err := k.params(p)
		if err != nil {
			return Report{}, err
		}
		return w.Run(ctx, run, v)
	}
	if w.Lease != nil {
		out.lease = func(p Params) Lease {
			v, err := k.params(p)
			if err != nil {
				return Lease{}
			}
			return w.Lease(v)
		}
	}
	if w.Claim != nil {
		out.claim = func(ctx context.Context, run *Run, p Params) (int64, error) {
			v, err := k.params(p)
			if err != nil {
				return 0, err
			}
			return w.Claim(ctx, run, v)
		}
	}
	if w.AlreadyCompleted != nil {
		out.completed = func(ctx context.Context, run *Run, p Params) (*CompletedError, error) {
			v, err := k.params(p)
			if err != nil {
				return nil, err
			}
			return w.AlreadyCompleted(ctx, run, v)
		}
	}
	if w.Tick != nil {
		out.tick = func(at time.Time) (Params, error) {
			v, err := w.Tick(at)
			if err != nil {
				return Params{}, err
			}
			return k.wrap(v), nil
		}
	}
	if w.Incomplete != nil {
		out.incomplete = func(ctx context.Context) ([]Incomplete[Params], error) {
			list, err := w.Incomplete(ctx)
			out := make([]Incomplete[Params], len(list))
			for i, in := range list {
				out[i] = Incomplete[Params]{Params: k.wrap(in.Params), Trigger: in.Trigger, Since: in.Since, State: in.State}
			}
			return out, err
		}
	}
	if c := w.Completions; c != nil {
		out.records = func(p Params) bool {
			v, err := k.params(p)
			return err == nil && c.Records(v)
		}
		out.published = func(ctx context.Context, p Params, fence int64) error {
			v, err := k.params(p)
			if err != nil {
				return err
			}
			return c.Published(ctx, v, fence)
		}
		out.unpublished = func(ctx context.Context, olderThan time.Duration, limit int) ([]Completion[Params], error) {
			list, err := c.Unpublished(ctx, olderThan, limit)
			out := make([]Completion[Params], len(list))
			for i, c := range list {
				out[i] = Completion[Params]{Params: k.wrap(c.Params), EventID: c.EventID, Owner: c.Owner, Fence: c.Fence,
					LockFence: c.LockFence, Trigger: c.Trigger, Counts: c.Counts, Finished: c.Finished}
			}
			return out, err
		}
	}
	return out, nil
}

// checkWorker refuses a Worker whose capabilities would not take effect as
// declared: each one is named where it is missing.
func (k *def[P]) checkWorker(w Worker[P]) error {
	d, name := k.d, k.d.Spec.Name
	fail := func(format string, args ...any) error {
		return fmt.Errorf("owned: kind %q: "+format, append([]any{name}, args...)...)
	}
	switch {
	case w.Run == nil:
		return fail("its Worker has no Run")
	case w.Schedule != "" && w.Tick == nil:
		return fail("its Worker has a Schedule (%q) and no Tick", w.Schedule)
	case d.StatusID != nil && w.Status == nil:
		return fail("Def.StatusID is set and its Worker has no Status: GET %s/{id} would answer nothing", d.Spec.HTTPPath)
	case d.StatusID == nil && w.Status != nil:
		return fail("its Worker has a Status and Def.StatusID is not set: GET %s/{id} would never be routed", d.Spec.HTTPPath)
	case d.StatusID != nil && d.Spec.HTTPPath == "":
		return fail("Def.StatusID needs an HTTPPath")
	case w.AlreadyCompleted != nil && w.Claim == nil:
		return fail("its Worker has AlreadyCompleted and no Claim: only a claimed run can be complete before its lock")
	case w.Incomplete != nil && d.Encode == nil:
		return fail("its Worker has Incomplete and Def has no Encode: the resumer records requests as Encode gives them")
	}
	if c := w.Completions; c != nil && (c.Records == nil || c.Published == nil || c.Unpublished == nil) {
		return fail("Worker.Completions needs Records, Published and Unpublished")
	}
	return nil
}

// CheckOpen opens k with d, as NewRunner does, and returns the error that
// Open or the check of its Worker against k's Def gives (ownedtest.CheckKind
// runs it for every kind). Nothing is contacted.
func CheckOpen(k Kind, d Deps) error {
	if k == nil {
		return errors.New("owned: nil Kind")
	}
	if err := k.check(); err != nil {
		return err
	}
	_, err := k.open(d)
	return err
}

// NewParams are the Params of a run of k with p, for a caller that holds a
// P already (a test, a library calling the template): an error when k does
// not take a P. A transport decodes instead (Kind.Decode).
func NewParams[P any](k Kind, p P) (Params, error) {
	d, ok := k.(*def[P])
	if !ok {
		var zero P
		return Params{}, fmt.Errorf("owned: kind %q does not take params of type %T", k.Spec().Name, zero)
	}
	return d.wrap(p), nil
}

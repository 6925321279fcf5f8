package ownedtest

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
)

// Case is one trigger a kind's conformance check sends through every
// source: its JSON fields (a Kafka record's value and an HTTP body, without
// request_id and requested_by), its record key, and the CLI's flags that
// ask for the same run.
type Case struct {
	Name string
	// Fields are the trigger's fields.
	Fields map[string]any
	// Key is the Kafka record key (nil: none).
	Key []byte
	// Args are `coordinator run KIND`'s flags and arguments asking for the
	// same run; nil: the case has no CLI form.
	Args []string
	// Reason, when set, is the rejection every source the case gives must
	// answer with: Kafka and HTTP when Fields are set (HTTP only without a
	// Key: a body has none), the CLI when Args are.
	Reason string
}

// CheckKind is the conformance check a kind runs against itself, with
// cases of its own (at least one accepted). It fails t when:
//
//   - the registry refuses the kind (a Def without Decode, LockKey or Open,
//     a bad name or path), or its Worker, opened with no database, is
//     refused (a capability declared half: Status without Def.StatusID, a
//     Schedule without Tick, Incomplete without Encode) or contacts
//     something;
//   - a case is decoded differently by Kafka, HTTP and the CLI (or one of
//     them rejects it, or rejects a bad case for another reason);
//   - Encode and Decode do not round-trip (what `coordinator trigger` sends
//     and what the resumer records must come back as the same run);
//   - a lock key lies outside the kind's namespace, or the key read from a
//     record key (Def.RecordLockKey) is another run's;
//   - an HTTP body with a field the kind does not know is accepted.
func CheckKind(t testing.TB, k owned.Kind, cases ...Case) {
	t.Helper()
	if _, err := owned.NewRegistry(k); err != nil {
		t.Fatalf("the registry refuses the kind: %v", err)
	}
	spec := owned.Normalize(k.Spec())
	if err := owned.CheckOpen(k, owned.Deps{}); err != nil {
		t.Errorf("%s: Open with no database: %v", spec.Name, err)
	}
	accepted := 0
	for _, c := range cases {
		name := spec.Name + "/" + c.Name
		if c.Reason != "" {
			checkRejected(t, k, spec, name, c)
			continue
		}
		accepted++
		checkAccepted(t, k, spec, name, c)
	}
	if accepted == 0 {
		t.Errorf("%s: CheckKind needs at least one case the kind accepts", spec.Name)
	}
}

func checkAccepted(t testing.TB, k owned.Kind, spec owned.Spec, name string, c Case) {
	t.Helper()
	p, err := k.Decode(input(t, job.SourceKafka, c.Key, c.Fields, false))
	if err != nil {
		t.Errorf("%s: Kafka decode: %v", name, err)
		return
	}
	key := k.LockKey(p)
	if !strings.HasPrefix(key, spec.Name+":") || len(key) == len(spec.Name)+1 {
		t.Errorf("%s: lock key %q is outside the kind's namespace %q", name, key, spec.Name+":")
	}
	want := encoded(t, name, k, p)
	if spec.HTTPPath != "" {
		hp, err := k.Decode(input(t, job.SourceHTTP, nil, c.Fields, true))
		switch {
		case err != nil:
			t.Errorf("%s: HTTP decode of what Kafka accepts: %v", name, err)
		case encoded(t, name, k, hp) != want:
			t.Errorf("%s: HTTP decodes another run than Kafka: %s, not %s", name, encoded(t, name, k, hp), want)
		}
		withExtra := map[string]any{"conformance_unknown_field": true}
		for f, v := range c.Fields {
			withExtra[f] = v
		}
		if _, err := k.Decode(input(t, job.SourceHTTP, nil, withExtra, true)); err == nil || owned.RejectionOf(err).Reason != owned.ReasonMalformedJSON {
			t.Errorf("%s: an HTTP body with an unknown field is not refused malformed_json: %v", name, err)
		}
	}
	// What `coordinator trigger` sends and the resumer records comes back
	// as the same run.
	rkey, fields, err := k.Encode(p)
	if err != nil {
		t.Errorf("%s: Encode: %v", name, err)
		return
	}
	for _, src := range []job.Source{job.SourceKafka, job.SourceResume} {
		p2, err := k.Decode(input(t, src, rkey, fields, false))
		switch {
		case err != nil:
			t.Errorf("%s: %s decode of Encode's fields %v: %v", name, src, fields, err)
		case encoded(t, name, k, p2) != want || k.LockKey(p2) != key:
			t.Errorf("%s: Encode and Decode (%s) do not round-trip: %s, not %s", name, src, encoded(t, name, k, p2), want)
		}
	}
	if len(rkey) > 0 {
		if rk, ok := k.LockKeyOfRecord(rkey); ok && rk != key {
			t.Errorf("%s: record key %q names lock %q, the run locks %q", name, rkey, rk, key)
		}
	}
	if id, ok := k.StatusID(p); ok != k.HasStatus() || (ok && id == "") {
		t.Errorf("%s: StatusID = %q, %v; HasStatus %v", name, id, ok, k.HasStatus())
	}
	if c.Args != nil {
		cp, err := flags(t, k, c.Args)
		switch {
		case err != nil:
			t.Errorf("%s: the CLI's %q: %v", name, c.Args, err)
		case encoded(t, name, k, cp) != want:
			t.Errorf("%s: the CLI's %q ask for %s, the trigger's fields for %s", name, c.Args, encoded(t, name, k, cp), want)
		}
	}
}

func checkRejected(t testing.TB, k owned.Kind, spec owned.Spec, name string, c Case) {
	t.Helper()
	check := func(src string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: %s accepts bad input (want %s)", name, src, c.Reason)
			return
		}
		if got := owned.RejectionOf(err).Reason; got != c.Reason {
			t.Errorf("%s: %s rejects with %s, want %s: %v", name, src, got, c.Reason, err)
		}
	}
	if c.Fields != nil {
		_, err := k.Decode(input(t, job.SourceKafka, c.Key, c.Fields, false))
		check("Kafka", err)
		if spec.HTTPPath != "" && c.Key == nil {
			_, err = k.Decode(input(t, job.SourceHTTP, nil, c.Fields, true))
			check("HTTP", err)
		}
	}
	if c.Args != nil {
		_, err := flags(t, k, c.Args)
		check(fmt.Sprintf("the CLI's %q", c.Args), err)
	}
}

// flags is `coordinator run KIND args`: the kind's flags, then Decode.
func flags(t testing.TB, k owned.Kind, args []string) (owned.Params, error) {
	t.Helper()
	fs := flag.NewFlagSet("run "+k.Spec().Name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	build := k.Flags(fs)
	if err := fs.Parse(args); err != nil {
		return owned.Params{}, job.BadInput("%v", err)
	}
	in, err := build(fs.Args())
	if err != nil {
		return owned.Params{}, err
	}
	return k.Decode(in)
}

// encoded is p as Encode gives it, for comparing runs.
func encoded(t testing.TB, name string, k owned.Kind, p owned.Params) string {
	t.Helper()
	key, fields, err := k.Encode(p)
	if err != nil {
		t.Errorf("%s: Encode: %v", name, err)
		return ""
	}
	b, err := json.Marshal(fields)
	if err != nil {
		t.Errorf("%s: Encode's fields: %v", name, err)
	}
	return fmt.Sprintf("key %q fields %s", key, b)
}

func input(t testing.TB, src job.Source, key []byte, fields map[string]any, strict bool) owned.Input {
	t.Helper()
	raw := make(map[string]json.RawMessage, len(fields))
	for f, v := range fields {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("field %q: %v", f, err)
		}
		raw[f] = b
	}
	return owned.NewInput(src, key, raw, strict)
}

package owned_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/owned/ownedtest"
)

// kindWith is a kind with spec s that does nothing.
func kindWith(s owned.Spec) owned.Kind {
	return owned.Define(owned.Def[struct{}]{
		Spec:    s,
		Decode:  func(owned.Input) (struct{}, error) { return struct{}{}, nil },
		Encode:  func(struct{}) ([]byte, map[string]any) { return nil, nil },
		LockKey: func(struct{}) string { return s.Name + ":x" },
		Open:    func(owned.Deps) (owned.Worker[struct{}], error) { return owned.Worker[struct{}]{}, nil },
	})
}

func TestRegistryRefusesClashes(t *testing.T) {
	t.Parallel()
	aw := &ownedtest.Widget{Name: "alpha"}
	a, with := aw.Kind(), kindWith
	ok, err := owned.NewRegistry(a, (&ownedtest.Widget{Name: "beta"}).Kind())
	require.NoError(t, err)
	require.Equal(t, []string{"test.alpha.requested", "test.beta.requested"}, ok.Topics())
	require.Equal(t, []string{"alpha", "beta"}, ok.Commands())
	k, found := ok.ByTopic("test.beta.requested")
	require.True(t, found)
	require.Equal(t, "beta", k.Spec().Name)
	_, found = ok.ByCommand("gamma")
	require.False(t, found)

	for _, tc := range []struct {
		name  string
		kinds []owned.Kind
		want  string
	}{
		{"same name", []owned.Kind{a, with(owned.Spec{Name: "alpha", Command: "other"})}, `two kinds named "alpha"`},
		{"same command", []owned.Kind{a, with(owned.Spec{Name: "beta", Command: "alpha"})}, `share the command "alpha"`},
		{"same topic", []owned.Kind{a, with(owned.Spec{Name: "beta", Topic: "test.alpha.requested"})}, `share the topic "test.alpha.requested"`},
		{"same path", []owned.Kind{a, with(owned.Spec{Name: "beta", HTTPPath: "/v1/alpha"})}, `share the path "/v1/alpha"`},
		{"name with a colon", []owned.Kind{with(owned.Spec{Name: "a:b"})}, `character ':'`},
		{"empty name", []owned.Kind{with(owned.Spec{})}, "1 to 64"},
		{"path pattern", []owned.Kind{with(owned.Spec{Name: "beta", HTTPPath: "/v1/{x}"})}, "plain absolute path"},
		{"nil", []owned.Kind{nil}, "nil Kind"},
		{"no Decode", []owned.Kind{owned.Define(owned.Def[int]{Spec: owned.Spec{Name: "beta"}})}, `Def has no [Decode LockKey Open]`},
	} {
		_, err := owned.NewRegistry(tc.kinds...)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
}

func TestInputDecode(t *testing.T) {
	t.Parallel()
	fields := func(s string) map[string]json.RawMessage {
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(s), &m))
		return m
	}
	w := (&ownedtest.Widget{Name: "widget"}).Kind()
	in := owned.NewInput(job.SourceKafka, nil, fields(`{"n":3,"extra":true}`), false)
	p, err := w.Decode(in)
	require.NoError(t, err)
	require.Equal(t, "widget:3", w.LockKey(p))
	require.True(t, in.Has("extra"))
	require.False(t, in.Has("missing"))

	_, err = w.Decode(owned.NewInput(job.SourceHTTP, nil, fields(`{"n":3,"extra":true}`), true))
	require.ErrorIs(t, err, job.ErrBadInput)
	require.Equal(t, owned.ReasonMalformedJSON, owned.RejectionOf(err).Reason)
	require.Contains(t, err.Error(), `unknown field "extra"`)

	_, err = w.Decode(owned.NewInput(job.SourceKafka, nil, fields(`{"n":"three"}`), false))
	require.Equal(t, owned.ReasonMalformedJSON, owned.RejectionOf(err).Reason)
	require.Contains(t, err.Error(), `field "n" must be a int`)

	_, err = w.Decode(owned.NewInput(job.SourceKafka, nil, fields(`{"n":0}`), false))
	require.Equal(t, "bad_n", owned.RejectionOf(err).Reason)

	require.Equal(t, owned.ReasonBadInput, owned.RejectionOf(job.BadInput("x")).Reason)
	require.Equal(t, "x", owned.RejectionOf(job.BadInput("x")).Detail)
	require.Equal(t, owned.ReasonMalformedJSON, owned.RejectionOf(errors.New("y")).Reason)
}

func TestRejectDuplicateKeys(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{`{}`, `{"a":1,"b":{"a":1},"c":[{"a":1},{"a":2}]}`, `{"a":"a","b":["a","a"]}`, `[{"a":1},{"a":1}]`, `{"a":{"b":{"c":1}},"b":2}`, `not json`} {
		require.NoError(t, owned.RejectDuplicateKeys([]byte(ok)), ok)
	}
	for value, key := range map[string]string{`{"a":1,"a":2}`: "a", `{"x":{"b":1,"b":2}}`: "b", `{"x":[{"c":1,"c":1}]}`: "c",
		`{"a":[1,2],"a":3}`: "a", `{"a":{"z":1},"b":2,"a":3}`: "a"} {
		err := owned.RejectDuplicateKeys([]byte(value))
		require.Equal(t, owned.ReasonDuplicateKey, owned.RejectionOf(err).Reason, value)
		require.ErrorContains(t, err, `"`+key+`"`, value)
		require.ErrorIs(t, err, job.ErrBadInput)
	}
}

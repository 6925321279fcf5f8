package replenish_test

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/replenish"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { testenv.RemoveBinaries() }))
}

var kind = replenish.New()

// params are the Params of a replenishment of p.
func params(p replenish.Params) owned.Params {
	out, err := owned.NewParams(kind, p)
	if err != nil {
		panic(err)
	}
	return out
}

func decode(t *testing.T, body string, strict bool) (owned.Params, error) {
	t.Helper()
	var fields map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(body), &fields))
	return kind.Decode(owned.NewInput(job.SourceKafka, nil, fields, strict))
}

func TestDecode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body   string
		want   replenish.Params
		reason string
	}{
		{body: `{"first":"447700000000","count":1000}`, want: replenish.Params{First: "447700000000", Count: 1000}},
		{body: `{"first":"07700900008","count":4}`, want: replenish.Params{First: "07700900008", Count: 4}},
		{body: `{"msisdns":["447700000001","447700000002"]}`, want: replenish.Params{MSISDNs: []string{"447700000001", "447700000002"}}},
		{body: `{"msisdns":["447700000001"],"note":"ignored in Kafka"}`, want: replenish.Params{MSISDNs: []string{"447700000001"}}},
		{body: `{}`, reason: replenish.ReasonMissingNumbers},
		{body: `{"msisdns":[]}`, reason: replenish.ReasonMissingNumbers},
		{body: `{"count":5}`, reason: replenish.ReasonMissingNumbers},
		{body: `{"first":"447700000000"}`, reason: replenish.ReasonBadCount},
		{body: `{"first":"447700000000","count":0}`, reason: replenish.ReasonBadCount},
		{body: `{"first":"447700000000","count":10000001}`, reason: replenish.ReasonBadCount},
		{body: `{"first":"447700000000","count":1,"msisdns":["447700000001"]}`, reason: replenish.ReasonConflictingNumbers},
		{body: `{"first":"+44770000","count":1}`, reason: replenish.ReasonBadMSISDN},
		{body: `{"first":"1234567","count":1}`, reason: replenish.ReasonBadMSISDN},
		{body: `{"msisdns":["447700000001","44770000000x"]}`, reason: replenish.ReasonBadMSISDN},
		{body: `{"first":"99999999","count":2}`, reason: replenish.ReasonBadRange},
		{body: `{"first":447700000000,"count":1}`, reason: owned.ReasonMalformedJSON},
		{body: `{"first":"447700000000","count":1.5}`, reason: owned.ReasonMalformedJSON},
	} {
		p, err := decode(t, tc.body, false)
		if tc.reason == "" {
			require.NoError(t, err, tc.body)
			require.Equal(t, params(tc.want), p, tc.body)
			continue
		}
		require.ErrorIs(t, err, job.ErrBadInput, tc.body)
		re := owned.RejectionOf(err)
		require.Equal(t, tc.reason, re.Reason, "%s: %s", tc.body, re.Detail)
		require.NotEmpty(t, re.Detail)
		// Listed, so its DLQ counter exists at 0 before the first rejection.
		require.Contains(t, append(owned.SharedRejectReasons(), replenish.New().RejectReasons()...), re.Reason)
	}
	_, err := decode(t, `{"msisdns":["447700000001"],"note":"x"}`, true)
	require.ErrorContains(t, err, `unknown field "note"`, "HTTP bodies are strict")

	// Encode is Decode's inverse.
	for _, p := range []replenish.Params{{First: "0770090000", Count: 3}, {MSISDNs: []string{"447700000001"}}} {
		key, fields, err := kind.Encode(params(p))
		require.NoError(t, err)
		require.Nil(t, key)
		b, err := json.Marshal(fields)
		require.NoError(t, err)
		got, err := decode(t, string(b), true)
		require.NoError(t, err)
		require.Equal(t, params(p), got)
	}
	lk, ok := kind.LockKeyOfRecord([]byte("anything"))
	require.True(t, ok)
	require.Equal(t, "msisdn-pool:replenish", lk)
}

func TestFlags(t *testing.T) {
	t.Parallel()
	parse := func(args ...string) (owned.Params, error) {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		build := kind.Flags(fs)
		require.NoError(t, fs.Parse(args))
		in, err := build(fs.Args())
		if err != nil {
			return owned.Params{}, err
		}
		return kind.Decode(in)
	}
	p, err := parse("--first", "447700000000", "--count", "10")
	require.NoError(t, err)
	require.Equal(t, params(replenish.Params{First: "447700000000", Count: 10}), p)
	p, err = parse("447700000001", "447700000002")
	require.NoError(t, err)
	require.Equal(t, params(replenish.Params{MSISDNs: []string{"447700000001", "447700000002"}}), p)
	for _, args := range [][]string{{}, {"--count", "3"}, {"--first", "447700000000"}, {"--first", "447700000000", "--count", "1", "447700000009"},
		{"--first", "abc", "--count", "1"}, {"12"}, {"--first", "447700000000", "--count", "0"}} {
		_, err := parse(args...)
		require.ErrorIs(t, err, job.ErrBadInput, "%v", args)
	}
}

// Through the template on the real Postgres: the numbers are added under
// the lock (reentrantly, by Pool.Replenish), idempotently, with the counts
// and events of every kind.
func TestRunAddsNumbersIdempotently(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a", WaitTime: 100 * time.Millisecond})
	defer l.Close()
	reg, err := owned.NewRegistry(kind)
	require.NoError(t, err)
	rec := &events.Recorder{}
	r, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{DB: pg.Pool, Locker: l}, Replica: "replica-a", Emit: rec})
	require.NoError(t, err)
	ctx := context.Background()
	trig := job.Trigger{Source: job.SourceCLI, RequestID: "r-1"}

	res := r.Run(ctx, kind, params(replenish.Params{First: "447700000000", Count: 100}), trig)
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, "msisdn-pool", res.Job)
	require.Equal(t, "msisdn-pool:replenish", res.Key)
	require.Equal(t, map[string]int64{"added": 100, "existing": 0, "offered": 100}, res.Counts)
	require.Equal(t, []events.Type{events.OwnershipAcquired, events.RunCompleted, events.OwnershipReleased}, types(rec))
	require.Equal(t, int64(100), rec.OfType(events.RunCompleted)[0].Extra["added"])
	require.Equal(t, int64(100), freeNumbers(t, pg))

	res = r.Run(ctx, kind, params(replenish.Params{MSISDNs: []string{"447700000099", "447700000100"}}), trig)
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, map[string]int64{"added": 1, "existing": 1, "offered": 2}, res.Counts)
	require.Equal(t, int64(101), freeNumbers(t, pg))

	// Another holder of the lock: already_owned, nothing added.
	held, err := l.Acquire(ctx, replenish.Key, 0)
	require.NoError(t, err)
	res = r.Run(ctx, kind, params(replenish.Params{MSISDNs: []string{"447700000200"}}), trig)
	require.Equal(t, job.OutcomeAlreadyOwned, res.Outcome)
	require.Equal(t, "replica-a", res.Owner)
	require.NoError(t, held.Release(ctx))
	require.Equal(t, int64(101), freeNumbers(t, pg))
	locks, err := l.Locks(ctx)
	require.NoError(t, err)
	require.Empty(t, locks)
}

func types(r *events.Recorder) []events.Type {
	var out []events.Type
	for _, e := range r.Events() {
		out = append(out, e.Type)
	}
	return out
}

func freeNumbers(t *testing.T, pg *testenv.PG) int64 {
	t.Helper()
	var n int64
	require.NoError(t, pg.Pool.QueryRow(context.Background(), `select count(*) from msisdn_pool where state = 'FREE'`).Scan(&n))
	return n
}

type lastProgress struct{ seen []owned.Progress }

func (l *lastProgress) Track(run *owned.Run) func() {
	return func() { l.seen = append(l.seen, run.Progress()) }
}

func TestReplenishReportsProgress(t *testing.T) {
	t.Parallel()
	pg := testenv.Postgres(t)
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a", WaitTime: 100 * time.Millisecond})
	defer l.Close()
	reg, err := owned.NewRegistry(kind)
	require.NoError(t, err)
	prog := &lastProgress{}
	r, err := owned.NewRunner(reg, owned.RunnerConfig{Deps: owned.Deps{DB: pg.Pool, Locker: l}, Progress: prog, Emit: &events.Recorder{}})
	require.NoError(t, err)
	res := r.Run(context.Background(), kind, params(replenish.Params{First: "447700000000", Count: 50}), job.Trigger{})
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Len(t, prog.seen, 1)
	require.Equal(t, int64(1), prog.seen[0].BatchesTotal, "one transaction")
	require.Equal(t, int64(1), prog.seen[0].BatchesCommitted)
	require.Equal(t, int64(50), prog.seen[0].Rows)
	require.Equal(t, 100.0, prog.seen[0].Percent)
}

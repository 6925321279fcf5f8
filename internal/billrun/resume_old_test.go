package billrun_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
)

// A run of a period older than the age limit was admitted with --force
// once; the resumer hands its Params back through Encode and Decode, which
// must not refuse it as period_too_old (it would never resume).
func TestIncompleteOldPeriodStaysAdmittedForTheResumer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := billrun.PeriodOf(time.Now().UTC().AddDate(0, -30, 0))
	_, err := b.pool.Exec(context.Background(), `insert into bill_runs (period, status) values ($1, 'INTERRUPTED')`, old.String())
	require.NoError(t, err)

	k := billrun.New(billrun.Config{})
	inc, err := billrun.Incomplete(context.Background(), b.pool)
	require.NoError(t, err)
	require.Len(t, inc, 1)

	key, fields, err := k.Encode(params(k, inc[0].Params))
	require.NoError(t, err)
	raw := map[string]json.RawMessage{}
	for name, v := range fields {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		raw[name] = b
	}
	p, err := k.Decode(owned.NewInput(job.SourceResume, key, raw, false))
	require.NoError(t, err, "an admitted run's period is decoded again for the resumer")
	require.Equal(t, "billrun:"+old.String(), k.LockKey(p))
}

// An adjustment asked for while the period's bill run is still incomplete
// is refused (the caller's input); it must not overwrite the bill run's
// pending request with a permanent one, which would stop its resumption.
func TestRefusedAdjustmentLeavesTheBillRunsRequestPending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `insert into bill_runs (period, status) values ($1, 'INTERRUPTED')`, period.String())
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `insert into run_requests (job, run_key, fields, trigger_source)
		values ('billrun', $1, jsonb_build_object('period', $2::text), 'kafka')`, "billrun:"+period.String(), period.String())
	require.NoError(t, err)

	r := b.runner(billrun.Config{})
	res := r.template.Run(ctx, r.kind, params(r.kind, billrun.Request{Period: period, Adjust: true}), job.Trigger{Source: job.SourceKafka, RequestID: "adjust-early"})
	require.Equal(t, job.OutcomeFailed, res.Outcome, res.Error)
	require.Contains(t, res.Error, "not COMPLETED")
	require.True(t, res.BadInput, "refused on the caller's input")
	require.Equal(t, job.ExitUsage, res.ExitCode())

	var permanent bool
	var fields string
	require.NoError(t, b.pool.QueryRow(ctx, `select permanent, fields::text from run_requests where run_key = $1`,
		"billrun:"+period.String()).Scan(&permanent, &fields))
	require.False(t, permanent, "the bill run's request is still pending")
	require.NotContains(t, fields, "adjust", "and still the bill run's")
}

// A request recorded for the resumer without force, for a period that has
// passed the age limit since, is still decoded for the resumer; other
// sources still need force.
func TestResumerDecodesARecordedRequestPastTheAgeLimit(t *testing.T) {
	t.Parallel()
	k := billrun.New(billrun.Config{})
	old := billrun.PeriodOf(time.Now().UTC().AddDate(0, -30, 0))
	fields := map[string]json.RawMessage{"period": json.RawMessage(`"` + old.String() + `"`)}
	_, err := k.Decode(owned.NewInput(job.SourceKafka, nil, fields, false))
	require.ErrorContains(t, err, "period_too_old")
	p, err := k.Decode(owned.NewInput(job.SourceResume, nil, fields, false))
	require.NoError(t, err)
	require.Equal(t, "billrun:"+old.String(), k.LockKey(p))
}

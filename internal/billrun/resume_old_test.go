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
	w, err := k.Open(owned.Deps{DB: b.pool, Locker: b.locker})
	require.NoError(t, err)
	inc, err := w.(owned.Resumable).Incomplete(context.Background())
	require.NoError(t, err)
	require.Len(t, inc, 1)

	key, fields := k.Encode(inc[0].Params)
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

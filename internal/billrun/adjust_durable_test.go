package billrun_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// An adjustment run that billed unbilled subscribers and said so
// (run.completed, invoices_created) on a server that acknowledges commits
// before they are durable (synchronous_commit=off): an immediate restart
// right after it must not lose those invoices, since nothing retries an
// adjustment run (the resumer resumes bill runs only) and its result was
// already reported. Its transaction commits with synchronous_commit on, as
// the bill run's completion does. (Before, the restart lost both: 0 of 2.)
func TestAdjustmentIsDurableOnceReported(t *testing.T) {
	t.Parallel()
	srv, pool := ownServer(t, "synchronous_commit=off", "wal_writer_delay=10s", "autovacuum=off")
	ctx := context.Background()
	locker := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a"})
	defer locker.Close()
	b := &bundle{pool: pool, locker: locker, rec: &events.Recorder{}}
	b.insertSubs(t, period, []sub{{id: 1, status: "ACTIVE", fee: 1000}, {id: 2, status: "ACTIVE", fee: 2000, usage: 5}})
	r := b.runner(billrun.Config{})
	res := r.Run(ctx, period, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)

	// Loaded late (created after the cutoff): made durable before the
	// adjustment, so only the adjustment's own commit is at stake.
	late := []sub{{id: 3, status: "ACTIVE", fee: 500, usage: 70}, {id: 4, status: "ACTIVE", fee: 700}}
	b.insertSubs(t, period, late)
	_, err := pool.Exec(ctx, `checkpoint`)
	require.NoError(t, err)

	res = r.template.Run(ctx, r.kind, params(r.kind, billrun.Request{Period: period, Adjust: true}), trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(2), res.Counts[billrun.CountInvoicesCreated])

	srv.Kill() // pg_ctl stop -m immediate, right after the adjustment reported
	srv.Start()
	var n int64
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NoError(c, pool.QueryRow(ctx, `select count(*) from invoices where period = $1 and adjust_fence is not null`, period.String()).Scan(&n))
	}, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, int64(2), n, "the invoices the adjustment run reported survive an immediate restart")
	st, err := billrun.ReadStatus(ctx, pool, period)
	require.NoError(t, err)
	require.NotNil(t, st.Adjustments)
	require.Equal(t, billrun.StatusCompleted, st.Adjustments.Status)
}

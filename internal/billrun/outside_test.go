package billrun_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
)

// The period's invoices are the population exactly, or the completion
// says how far they are not: an invoice of a subscriber outside the
// population at the cutoff (one terminated, by status alone, after its
// batch billed it; one another writer invoiced although it is suspended)
// is counted in run.completed (outside_population) and logged. Nothing is
// deleted: an invoice is evidence, and which of the two is wrong (the
// invoice or the subscriber's row) only the business knows. (Before, the
// run completed with population 5 beside 7 invoices of the period and said
// nothing of the two.)
func TestInvoicesOutsideThePopulationAreReported(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	subs := make([]sub, 0, 7)
	for id := int64(1); id <= 6; id++ {
		subs = append(subs, sub{id: id, status: "ACTIVE", fee: 1000})
	}
	subs = append(subs, sub{id: 7, status: "SUSPENDED", fee: 1000})
	b.insertSubs(t, period, subs)
	_, err := b.pool.Exec(ctx, `insert into invoices (subscriber_id, period, amount_cents) values (7, $1, 1000)`, period.String())
	require.NoError(t, err)
	var n atomic.Int64
	hook := func(ctx context.Context, _, _ int64) error {
		if n.Add(1) != 2 {
			return nil
		}
		_, err := b.pool.Exec(ctx, `update subscribers set status = 'TERMINATED' where id = 2`) // billed by batch 1
		return err
	}
	logs := &logRecorder{msg: "billrun_outside_population"}
	res := b.runner(billrun.WithBeforeBatch(billrun.Config{BatchSize: 3, Workers: 1, Logger: slog.New(logs)}, hook)).Run(ctx, period, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(5), res.Counts[billrun.CountPopulation])
	require.Equal(t, int64(7), b.count(t, `select count(*) from invoices where period = $1`, period.String()))
	require.Equal(t, int64(2), res.Counts[billrun.CountOutsidePopulation])
	done := b.rec.OfType(events.RunCompleted)
	require.Len(t, done, 1)
	require.EqualValues(t, 2, done[0].Extra[billrun.CountOutsidePopulation])
	recs := logs.records()
	require.Len(t, recs, 1)
	require.EqualValues(t, 2, recs[0][billrun.CountOutsidePopulation].Int64())
	require.Equal(t, []int64{2, 7}, recs[0]["sample"].Any())

	// A period whose invoices are its population says 0.
	c := setup(t)
	c.insertSubs(t, period, subs[:3])
	res = c.runner(billrun.Config{}).Run(ctx, period, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Equal(t, int64(0), res.Counts[billrun.CountOutsidePopulation])
}

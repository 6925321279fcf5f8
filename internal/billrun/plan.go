package billrun

import (
	"context"
	"math"

	"github.com/jackc/pgx/v5"
)

// batchRange is one planned batch: the population's subscribers with ids in
// [first, last].
type batchRange struct {
	first, last int64
	n           int64
}

// committedRanges are the batches earlier runs of the period committed (the
// resume point), in id order.
func (x *execution) committedRanges(ctx context.Context) ([]batchRange, error) {
	rows, err := x.pool.Query(ctx, sqlCommittedRanges, x.period.String())
	if err != nil {
		return nil, err
	}
	var out []batchRange
	var b batchRange
	_, err = pgx.ForEachRow(rows, []any{&b.first, &b.last}, func() error {
		out = append(out, b)
		return nil
	})
	return out, err
}

// plan walks the population's subscriber ids in keyset steps of BatchSize, never into
// a committed range: a step is bounded by the next committed range's first
// id, and a committed range is jumped over whole. Batches go to out as they
// are found, so memory stays flat however many subscribers there are.
func (x *execution) plan(ctx context.Context, committed []batchRange, out chan<- batchRange, st *runState) error {
	cursor := int64(math.MinInt64)
	next := 0 // index of the first committed range after cursor
	for {
		bound := int64(math.MaxInt64)
		if next < len(committed) {
			bound = committed[next].first - 1
		}
		var b batchRange
		err := x.retry(ctx, "plan", func(ctx context.Context) error {
			return x.pool.QueryRow(ctx, sqlNextBatch, cursor, bound, x.cfg.BatchSize,
				x.cut.start, x.cut.end, x.cut.at).Scan(&b.first, &b.last, &b.n)
		})
		if err != nil {
			return err
		}
		if b.n == 0 {
			if next >= len(committed) {
				return nil
			}
			cursor = committed[next].last
			next++
			continue
		}
		st.mu.Lock()
		st.planned++
		st.mu.Unlock()
		select {
		case out <- b:
		case <-ctx.Done():
			return ctx.Err()
		}
		cursor = b.last
	}
}

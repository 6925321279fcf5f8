package billrun_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/eventsink"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/topics"
)

// ackEmitter acknowledges every event at once, as a sink whose Kafka
// answered, except run.completed while drop is set: that one is lost, as
// in the buffer of a replica SIGKILLed before Kafka acknowledged it.
type ackEmitter struct {
	drop atomic.Bool
	mu   sync.Mutex
	sent []events.Event // delivered (acknowledged or not asked to be)
	lost []events.Event
}

func (a *ackEmitter) Emit(ctx context.Context, e events.Event) { a.EmitAcked(ctx, e, nil) }

func (a *ackEmitter) EmitAcked(_ context.Context, e events.Event, onAcked func()) {
	a.mu.Lock()
	if e.Type == events.RunCompleted && a.drop.Load() {
		a.lost = append(a.lost, e)
		a.mu.Unlock()
		return
	}
	a.sent = append(a.sent, e)
	a.mu.Unlock()
	if onAcked != nil {
		onAcked()
	}
}

func (a *ackEmitter) completed() []events.Event {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []events.Event
	for _, e := range a.sent {
		if e.Type == events.RunCompleted {
			out = append(out, e)
		}
	}
	return out
}

// lossyRunner runs bill runs as replica ("": the locker's owner) whose
// run.completed is lost (em.drop) until the test sets drop to false.
func lossyRunner(b *bundle, replica string) (*ackEmitter, runner) {
	em := &ackEmitter{}
	em.drop.Store(true)
	return em, newRunner(b.pool, b.locker, replica, em, billrun.Config{BatchSize: 25, RetryBackoff: 10 * time.Millisecond})
}

// scanOnce is one scan of a fresh resumer on tmpl (no memory of earlier
// re-publications) whose grace period is after.
func scanOnce(t *testing.T, tmpl *owned.Runner, after time.Duration) {
	t.Helper()
	rs, err := owned.NewResumer(owned.ResumerConfig{Runner: tmpl, RepublishAfter: after})
	require.NoError(t, err)
	rs.Scan(context.Background())
}

// completedEventAt reads bill_runs.completed_event_at of period (nil: NULL).
func (b *bundle) completedEventAt(t require.TestingT, p billrun.Period) *time.Time {
	var at *time.Time
	require.NoError(t, b.pool.QueryRow(context.Background(), `select completed_event_at from bill_runs where period = $1`, p.String()).Scan(&at))
	return at
}

// completionEventID reads bill_runs.completion_event_id of period ("": NULL).
func (b *bundle) completionEventID(t require.TestingT, p billrun.Period) string {
	var id *string
	require.NoError(t, b.pool.QueryRow(context.Background(), `select completion_event_id from bill_runs where period = $1`, p.String()).Scan(&id))
	if id == nil {
		return ""
	}
	return *id
}

// RELIABILITY.md row 9: a bill run's COMPLETED row commits and its
// run.completed never reaches Kafka (its replica was SIGKILLed with the
// event in its buffer). A resumer scan of another replica publishes it
// again with the same id, naming the owner, and marks it acknowledged; a
// second scan publishes nothing more.
func TestLostRunCompletedIsRepublishedWithItsID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 60})
	ctx := context.Background()
	em, r := lossyRunner(b, "")
	res := r.Run(ctx, period, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.Len(t, em.lost, 1)
	lost := em.lost[0]
	require.Len(t, lost.ID, 32)
	require.Equal(t, lost.ID, b.completionEventID(t, period), "the completion keeps its run.completed's id")
	require.Nil(t, b.completedEventAt(t, period), "no acknowledgement, no mark")

	// Another replica's resumer; the grace is over at once.
	other := newRunner(b.pool, b.locker, "replica-b", em, billrun.Config{BatchSize: 25, RetryBackoff: 10 * time.Millisecond})
	em.drop.Store(false)
	rs, err := owned.NewResumer(owned.ResumerConfig{Runner: other.template, RepublishAfter: time.Nanosecond})
	require.NoError(t, err)
	rs.Scan(ctx)
	again := em.completed()
	require.Len(t, again, 1)
	e := again[0]
	require.Equal(t, lost.ID, e.ID, "the re-publication carries the lost event's id")
	require.Equal(t, "replica-a", e.Replica, "data.replica is the owner")
	require.Equal(t, res.Fence, e.Fence)
	require.Equal(t, lost.Extra["lock_fence"], e.Extra["lock_fence"])
	require.Equal(t, lost.Key, e.Key)
	require.Equal(t, lost.RequestID, e.RequestID)
	require.Equal(t, true, e.Extra["republished"])
	require.Equal(t, "replica-b", e.Extra["republished_by"])
	require.Equal(t, lost.Extra[billrun.CountPeriodInvoicesCreated], e.Extra[billrun.CountPeriodInvoicesCreated])
	require.Equal(t, int64(60), e.Extra[billrun.CountPeriodSubscribers])
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NotNil(c, b.completedEventAt(c, period), "marked once acknowledged")
	}, 10*time.Second, 10*time.Millisecond)

	rs.Scan(ctx)
	require.Len(t, em.completed(), 1, "an acknowledged completion is not published again")
	// Nor by a fresh replica, which has no memory of it.
	scanOnce(t, other.template, time.Nanosecond)
	require.Len(t, em.completed(), 1)
}

// A re-publication that is lost too leaves the completion unmarked, for a
// later scan; one within the grace period is not re-published.
func TestRepublishedRunCompletedLostAgainStaysForTheNextScan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 30})
	ctx := context.Background()
	em, r := lossyRunner(b, "")
	res := r.Run(ctx, period, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)

	scanOnce(t, r.template, time.Hour)
	require.Len(t, em.lost, 1, "within the grace period nothing is re-published")

	scanOnce(t, r.template, time.Nanosecond) // dropped again
	require.Len(t, em.lost, 2)
	require.Equal(t, em.lost[0].ID, em.lost[1].ID)
	require.Nil(t, b.completedEventAt(t, period))

	em.drop.Store(false)
	scanOnce(t, r.template, time.Nanosecond)
	require.Len(t, em.completed(), 1)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NotNil(c, b.completedEventAt(c, period))
	}, 10*time.Second, 10*time.Millisecond)
}

// A run on the real Kafka sink: once Kafka acknowledged its run.completed,
// bill_runs.completed_event_at is set.
func TestRunCompletedAcknowledgedByKafkaIsMarked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seed(t, billrun.SeedConfig{Subscribers: 40})
	k := testenv.Kafka(t)
	names := topics.New(k.Suffix)
	adm, err := topics.Dial(k.Brokers)
	require.NoError(t, err)
	defer adm.Close()
	tctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = adm.CreateTopics(tctx, 1, -1, nil, names.Events)
	require.NoError(t, err)
	defer func() { _, _ = adm.DeleteTopics(context.Background(), names.Events) }()
	sink, err := eventsink.New(eventsink.Config{Brokers: k.Brokers, Topic: names.Events})
	require.NoError(t, err)
	require.NoError(t, sink.Start(context.Background()))
	defer sink.Stop()

	res := newRunner(b.pool, b.locker, "", events.Multi{b.rec, sink}, billrun.Config{BatchSize: 25}).Run(context.Background(), period, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NotNil(c, b.completedEventAt(c, period), "marked once Kafka acknowledged run.completed")
	}, 30*time.Second, 20*time.Millisecond)
	var got []events.Event
	for _, e := range b.rec.Events() {
		if e.Type == events.RunCompleted {
			got = append(got, e)
		}
	}
	require.Len(t, got, 1)
	require.Equal(t, b.completionEventID(t, period), got[0].ID)
}

// An adjustment run's run.completed is not a tracked completion: it is
// another event than the bill run's, and it touches neither the stored id
// nor completed_event_at.
func TestAdjustmentRunCompletedKeepsItsOwnID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.insertSubs(t, period, []sub{{id: 1, status: "ACTIVE", fee: 1000}, {id: 2, status: "ACTIVE", fee: 2000}})
	em := &ackEmitter{}
	r := newRunner(b.pool, b.locker, "", em, billrun.Config{BatchSize: 25, RetryBackoff: 10 * time.Millisecond})
	res := r.Run(ctx, period, trig())
	require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.NotNil(c, b.completedEventAt(c, period))
	}, 10*time.Second, 10*time.Millisecond)
	marked := b.completedEventAt(t, period)

	_, err := b.pool.Exec(ctx, `insert into usage_charges (subscriber_id, period, amount_cents) values (1, $1, 30)`, period.String())
	require.NoError(t, err)
	adj := r.template.Run(ctx, r.kind, params(r.kind, billrun.Request{Period: period, Adjust: true}), trig())
	require.Equal(t, job.OutcomeCompleted, adj.Outcome, adj.Error)
	done := em.completed()
	require.Len(t, done, 2)
	require.Equal(t, b.completionEventID(t, period), done[0].ID)
	require.NotEqual(t, done[0].ID, done[1].ID, "the adjustment's run.completed is another event")
	require.True(t, marked.Equal(*b.completedEventAt(t, period)), "the bill run's mark is left alone")
}

// A COMPLETED row without a stored run.completed id (completed before
// migration 00014, or by a replica of an older version during a rolling
// upgrade, whose event had an id nobody kept) is never re-published: a
// second event with another id would read as a second completion. A lost
// completion of another period beside it still is.
func TestCompletionWithoutAStoredIDIsNotRepublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	older := period.Previous()
	b.seed(t, billrun.SeedConfig{Subscribers: 30})
	ctx := context.Background()
	em, r := lossyRunner(b, "")
	for _, p := range []billrun.Period{older, period} {
		res := r.Run(ctx, p, trig())
		require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
	}
	require.Len(t, em.lost, 2)
	_, err := b.pool.Exec(ctx, `update bill_runs set completion_event_id = null where period = $1`, older.String())
	require.NoError(t, err)

	em.drop.Store(false)
	scanOnce(t, r.template, time.Nanosecond)
	again := em.completed()
	require.Len(t, again, 1, "only the completion whose id was kept is re-published")
	require.Equal(t, billrun.LockKey(period), again[0].Key)
	require.Equal(t, b.completionEventID(t, period), again[0].ID)
	require.Nil(t, b.completedEventAt(t, older))
}

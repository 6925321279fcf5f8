package trigger_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
)

// gatedHandler blocks the runs of one period until its gate closes and
// records the order in which it saw request ids.
type gatedHandler struct {
	period string
	gate   chan struct{}

	mu   sync.Mutex
	seen []string
	ch   chan string
}

func (h *gatedHandler) Run(ctx context.Context, k owned.Kind, p owned.Params, t job.Trigger) (job.Result, error) {
	_, period, _ := strings.Cut(k.LockKey(p), ":")
	if period == h.period {
		select {
		case <-h.gate:
		case <-ctx.Done():
			return job.Result{Outcome: job.OutcomeLost}, nil
		}
	}
	h.mu.Lock()
	h.seen = append(h.seen, t.RequestID)
	h.mu.Unlock()
	h.ch <- t.RequestID
	return job.Result{Outcome: job.OutcomeAlreadyCompleted}, nil
}

func (h *gatedHandler) wait(t *testing.T, id string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case got := <-h.ch:
			if got == id {
				return
			}
		case <-deadline:
			t.Fatalf("%s was never handled", id)
		}
	}
}

// A trigger is not held up by another key's work on its partition: with a
// run of period A in flight (a long bill run), triggers for period B on the
// same partition are handled; those of A wait behind it, in order; and the
// committed offset never passes A's unhandled record (a redelivery after a
// crash repeats B's, which are answered again, rather than lose A's).
// Before the lanes, B waited for A: the test timed out at "b-1 was never
// handled".
func TestAKeyIsNotHeldUpByAnotherKeysWorkOnItsPartition(t *testing.T) {
	t.Parallel()
	b := setupKafka(t)
	h := &gatedHandler{period: "2026-01", gate: make(chan struct{}), ch: make(chan string, 100)}
	b.consumer(t, h, nil)
	manual, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(0))
	require.NoError(t, err)
	defer manual.Close()
	rec := func(period, id string) *kgo.Record {
		return &kgo.Record{Topic: b.bills, Partition: 0, Key: []byte(period),
			Value: []byte(fmt.Sprintf(`{"period":%q,"request_id":%q}`, period, id))}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a1, b1 := rec("2026-01", "a-1"), rec("2026-02", "b-1")
	require.NoError(t, manual.ProduceSync(ctx, a1, b1).FirstErr())
	h.wait(t, "b-1")
	a2, b2 := rec("2026-01", "a-2"), rec("2026-02", "b-2")
	require.NoError(t, manual.ProduceSync(ctx, a2, b2).FirstErr())
	h.wait(t, "b-2")
	require.Equal(t, int64(-1), b.committed(t, a1), "nothing is committed past a record not handled")

	close(h.gate)
	b.waitCommitted(t, b2, b2.Offset+1)
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Equal(t, []string{"b-1", "b-2", "a-1", "a-2"}, h.seen, "one key's records in order, behind its own")
}

package trigger_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/job"
)

// A handler that panics on a Kafka trigger (a bug in a kind's run) does
// not end the replica: the panic is recovered and logged, the trigger is
// not handled, so it is retried in its lane and committed only once a try
// handles it; other keys go on meanwhile. Failed before: the panic ended
// the process (the test binary), on every replica the partition moved to.
func TestKafkaHandlerPanicIsRecoveredAndRetried(t *testing.T) {
	t.Parallel()
	kb := setupKafka(t)
	var panics atomic.Int32
	h := newFake(func(_ int, c call) job.Outcome {
		if c.period == "2026-01" && panics.Load() < 2 {
			panics.Add(1)
			panic("a bug in a bill run")
		}
		return job.OutcomeCompleted
	})
	kb.consumer(t, h, nil)
	bad := kb.produce(t, kb.bills, "2026-01", `{"period":"2026-01"}`)
	other := kb.produce(t, kb.bills, "2026-02", `{"period":"2026-02"}`)

	for _, r := range []*kgo.Record{bad, other} { // on one partition or two
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			at, err := kb.committedOffset(r)
			require.NoError(c, err)
			require.GreaterOrEqual(c, at, r.Offset+1, "committed offset of %s/%d", r.Topic, r.Partition)
		}, 30*time.Second, 50*time.Millisecond)
	}
	tries := 0
	for _, c := range h.Calls() {
		if c.period == "2026-01" {
			tries++
		}
	}
	require.Equal(t, 3, tries, "two tries panicked, the third handled it")
	require.Equal(t, int32(2), panics.Load())
}

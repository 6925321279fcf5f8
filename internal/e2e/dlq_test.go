package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// A malformed record goes to the DLQ (original bytes, reason header) with a
// trigger.rejected event, its offset is committed, and the valid record
// behind it on the same partition is processed.
func TestMalformedTriggerGoesToDLQAndNextIsProcessed(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, "")
	period := monthsAgo(3)
	key := "billrun:" + period
	d.seedSubscribers(500, period)
	d.startReplicas(3, nil, "--reaper-schedule=")

	malformed := `{"period":"` + monthsAgo(3) + `","request_id":` // cut short
	partition, badOffset := d.produce(d.bills, period, malformed)
	p2, _ := d.produce(d.bills, period, billRunTrigger(period, "after-bad"))
	require.Equal(t, partition, p2, "same key, same partition: the valid record waits behind the bad one")

	rejected := d.events.waitFor(t, 30*time.Second, 1, "trigger.rejected", ofType("trigger.rejected", key))
	require.Equal(t, "malformed_json", rejected[0].str("reason"))
	require.Equal(t, "kafka", rejected[0].str("trigger"))

	done := d.events.waitFor(t, 30*time.Second, 1, "run.completed", ofType("run.completed", key))
	require.Equal(t, "after-bad", done[0].str("request_id"))
	d.requireInvoicesExact(period)
	d.waitCommitted(d.bills, partition, badOffset+2, 20*time.Second)

	// The DLQ holds the original bytes and says why.
	recs := testenv.ReadRecords(t, d.brokers, d.names.DLQ, 1)
	require.Len(t, recs, 1, "exactly the malformed record is dead-lettered")
	require.Equal(t, malformed, string(recs[0].Value))
	require.Equal(t, period, string(recs[0].Key))
	headers := map[string]string{}
	for _, h := range recs[0].Headers {
		headers[h.Key] = string(h.Value)
	}
	require.Equal(t, "malformed_json", headers["reason"])
	require.Equal(t, d.bills, headers["source-topic"])
}

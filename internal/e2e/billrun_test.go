package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The same bill-run trigger produced three times plus an HTTP trigger: one
// run.completed; invoices exact; every other trigger ends already_owned or
// already_completed naming a holder of the lock (at least one outcome per
// trigger: the resumer may answer a deferred one again).
func TestBillRunTriggeredFourTimesRunsOnce(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, "")
	period := monthsAgo(1)
	key := "billrun:" + period
	d.seedSubscribers(3000, period)
	// 26 batches of 100 at 150 ms each over 4 workers: the run lasts about
	// a second, long enough for the HTTP trigger to meet it in flight.
	rs := d.startReplicas(3, map[string]string{"COORDINATOR_TEST_BILLRUN_BATCH_DELAY": "150ms"}, "--reaper-schedule=")

	ids := []string{"kafka-1", "kafka-2", "kafka-3"}
	var partition int32
	for _, id := range ids {
		partition, _ = d.produce(d.bills, period, billRunTrigger(period, id))
	}
	acquired := d.events.waitFor(t, 30*time.Second, 1, "ownership.acquired", ofType("ownership.acquired", key))
	owner := acquired[0].str("replica")

	// The HTTP trigger goes to a replica that is not the owner, while the run is on.
	var other *replica
	for _, r := range rs {
		if r.id != owner {
			other = r
			break
		}
	}
	code, _, body := other.post(t, d.token, "/v1/billruns", fmt.Sprintf(`{"period":%q,"request_id":"http-1"}`, period))
	var p struct {
		Code, Reason, Owner, LockKey string
	}
	require.NoError(t, json.Unmarshal(body, &p))
	switch code {
	case http.StatusConflict:
		require.Equal(t, "LOCK_ACQUISITION_FAILED", p.Code)
		require.Equal(t, "already_owned", p.Reason)
		require.Equal(t, owner, p.Owner)
		require.Equal(t, key, p.LockKey)
	case http.StatusOK: // the run finished first
		require.Equal(t, owner, p.Owner)
	default:
		t.Fatalf("HTTP trigger: %d %s", code, body)
	}
	ids = append(ids, "http-1")

	// Every trigger ends with an outcome event.
	outcome := func(e event) bool {
		return e.Subject == key && (e.Type == "run.completed" || e.Type == "run.already_completed" || e.Type == "ownership.already_owned")
	}
	// Wait for each trigger's own: a trigger recorded for the resumer
	// (already_owned) may be answered a second time when it is resumed.
	require.Eventually(t, func() bool {
		have := map[string]bool{}
		for _, e := range d.events.match(outcome) {
			have[e.str("request_id")] = true
		}
		for _, id := range ids {
			if !have[id] {
				return false
			}
		}
		return true
	}, 60*time.Second, 20*time.Millisecond, "an outcome event for each of %v", ids)
	// Offsets are committed once handled: all three records.
	d.waitCommitted(d.bills, partition, 3, 20*time.Second)
	got := d.events.match(outcome)
	// A trigger answered already_owned is recorded for the resumer, which
	// asks again: it may meet the lock held by another replica for a moment
	// (answering an HTTP trigger already_completed), so an answer names the
	// holder of that moment, one of the replicas that acquired the key.
	holders := map[string]bool{}
	for _, e := range d.events.match(ofType("ownership.acquired", key)) {
		holders[e.str("replica")] = true
	}
	seen := map[string]string{}
	completed := 0
	for _, e := range got {
		seen[e.str("request_id")] = e.Type
		switch e.Type {
		case "run.completed":
			completed++
			require.Equal(t, owner, e.str("replica"))
		default:
			require.True(t, holders[e.str("owner")], "%s names a replica that held the lock (holders %v)", e, holders)
		}
	}
	require.Equal(t, 1, completed, "exactly one run.completed")
	for _, id := range ids {
		require.Contains(t, seen, id, "trigger %s has an outcome", id)
	}
	d.requireInvoicesExact(period)

	// GET /v1/billruns/{period} shows the finished run from bill_runs.
	code, body = rs[2].get(t, d.token, "/v1/billruns/"+period)
	require.Equal(t, http.StatusOK, code, string(body))
	var st struct {
		Status, Owner string
		Fence         int64
	}
	require.NoError(t, json.Unmarshal(body, &st))
	require.Equal(t, "COMPLETED", st.Status)
	require.Equal(t, owner, st.Owner)
	require.EqualValues(t, 1, st.Fence)

	// Graceful stop: exit 0.
	for _, r := range rs {
		require.Equal(t, 0, r.terminate(t, 20*time.Second))
	}
}

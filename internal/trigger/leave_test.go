package trigger_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/trigger"
)

// A consumer stopped while its group waits for a member that died (a
// replica SIGKILLed: it never left) stops within its LeaveTimeout, not when
// the broker gives up on the dead member's session (45 s by default, above
// the 30 s shutdown bound). Before, Stop waited in Close for the JoinGroup
// in flight (RELIABILITY.md row 14, seen first in the console's indexer).
func TestConsumerStopsInTimeWhileItsGroupWaitsForADeadMember(t *testing.T) {
	t.Parallel()
	b := setupKafka(t)
	// The member that dies: a long session, its client's context cancelled
	// without Close, so it never leaves.
	kill := testenv.DeadGroupMember(t, b.brokers, b.group, 40*time.Second, b.bills, b.widgets)
	testenv.WaitGroupStable(t, b.adm, b.group, 1)

	joins := make(chan struct{}, 16)
	c := b.consumer(t, newFake(nil), func(cfg *trigger.KafkaConfig) {
		cfg.LeaveTimeout = 2 * time.Second
		cfg.ClientOpts = []kgo.Opt{kgo.WithHooks(testenv.JoinHook(joins)), kgo.HeartbeatInterval(200 * time.Millisecond)}
	})
	testenv.WaitGroupStable(t, b.adm, b.group, 2)
	for len(joins) > 0 {
		<-joins
	}
	kill() // SIGKILL: no leave; the broker waits out its 40 s session

	// A third member joins: the group rebalances, and the consumer's
	// JoinGroup is held until the dead member's session ends.
	b.consumer(t, newFake(nil), func(cfg *trigger.KafkaConfig) { cfg.Replica = "r3" })
	select {
	case <-joins:
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer never rejoined")
	}
	start := time.Now()
	c.Stop()
	require.Less(t, time.Since(start), 15*time.Second, "Stop within its 2 s LeaveTimeout (and a loaded machine's margin), not the dead member's 40 s session")
}

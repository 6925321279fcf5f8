package trigger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

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
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	joined := func(n int) {
		require.Eventually(t, func() bool {
			gs, err := b.adm.DescribeGroups(ctx, b.group)
			if err != nil {
				return false
			}
			g := gs[b.group]
			return g.State == "Stable" && len(g.Members) == n
		}, 60*time.Second, 50*time.Millisecond, "%d members in a stable group", n)
	}
	// The member that dies: a long session, its client's context cancelled
	// without Close, so it never leaves.
	deadCtx, kill := context.WithCancel(context.Background())
	dead, err := kgo.NewClient(kgo.SeedBrokers(b.brokers...), kgo.ConsumerGroup(b.group), kgo.ConsumeTopics(b.bills, b.widgets),
		kgo.SessionTimeout(40*time.Second), kgo.WithContext(deadCtx))
	require.NoError(t, err)
	go func() {
		for deadCtx.Err() == nil {
			dead.PollRecords(deadCtx, 100)
		}
	}()
	joined(1)

	joins := make(chan struct{}, 16)
	c := b.consumer(t, newFake(nil), func(cfg *trigger.KafkaConfig) {
		cfg.LeaveTimeout = 2 * time.Second
		cfg.ClientOpts = []kgo.Opt{kgo.WithHooks(joinHook(joins)), kgo.HeartbeatInterval(200 * time.Millisecond)}
	})
	joined(2)
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

// joinHook signals every JoinGroup request a client writes.
type joinHook chan struct{}

func (h joinHook) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	const joinGroup = 11 // kmsg.JoinGroup
	if key == joinGroup && err == nil {
		select {
		case h <- struct{}{}:
		default:
		}
	}
}

package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// DeadGroupMember joins group (consuming topics) with a session of
// session, and returns kill: it ends the member as SIGKILL would, without
// leaving, so the broker waits out the session before a rebalance can
// complete without it.
func DeadGroupMember(t testing.TB, brokers []string, group string, session time.Duration, topics ...string) (kill func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topics...),
		kgo.SessionTimeout(session), kgo.WithContext(ctx))
	if err != nil {
		cancel()
		t.Fatalf("testenv: group member: %v", err)
	}
	go func() {
		for ctx.Err() == nil {
			cl.PollRecords(ctx, 100)
		}
	}()
	t.Cleanup(func() { cancel(); cl.Close() })
	return cancel
}

// WaitGroupStable waits until group is Stable with n members.
func WaitGroupStable(t testing.TB, adm *kadm.Client, group string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		gs, err := adm.DescribeGroups(ctx, group)
		return err == nil && gs[group].State == "Stable" && len(gs[group].Members) == n
	}, 60*time.Second, 50*time.Millisecond, "testenv: group %s not stable with %d members", group, n)
}

// JoinHook is a franz-go hook that signals every JoinGroup request its
// client writes (kgo.WithHooks).
type JoinHook chan struct{}

// OnBrokerWrite implements kgo.HookBrokerWrite.
func (h JoinHook) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	const joinGroup = 11 // kmsg.JoinGroup
	if key == joinGroup && err == nil {
		select {
		case h <- struct{}{}:
		default:
		}
	}
}

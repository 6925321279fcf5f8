package consoledb_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/consoledb"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// An indexer stopped while its group waits for a member that died (a
// replica SIGKILLed: it never left) stops within its StopTimeout, not when
// the broker gives up on the dead member's session. Before, Stop waited in
// Close for the JoinGroup in flight (RELIABILITY.md row 14: replicas hung
// past the shutdown bound, seed 20261205); here ~40 s.
func TestIndexerStopsInTimeWhileItsGroupWaitsForADeadMember(t *testing.T) {
	t.Parallel()
	pg, k := testenv.Postgres(t), testenv.Kafka(t)
	topic := k.Topic("coordinator.ownership.events")
	group := "g_" + k.Suffix + "-console-stop"
	admCl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	require.NoError(t, err)
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	_, err = adm.CreateTopic(ctx, 3, 1, nil, topic)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteGroups(ctx, group)
		_, _ = adm.DeleteTopics(ctx, topic)
	})

	// The member that dies: a long session, and its client's context
	// cancelled without Close, so it never leaves.
	kill := testenv.DeadGroupMember(t, k.Brokers, group, 40*time.Second, topic)
	testenv.WaitGroupStable(t, adm, group, 1)

	joins := make(chan struct{}, 16)
	x, err := consoledb.NewIndexer(consoledb.IndexerConfig{Brokers: k.Brokers, Topic: topic, Group: group, Pool: pg.Pool,
		StopTimeout: 2 * time.Second, ClientOpts: []kgo.Opt{kgo.WithHooks(testenv.JoinHook(joins)), kgo.HeartbeatInterval(200 * time.Millisecond)}})
	require.NoError(t, err)
	require.NoError(t, x.Start(ctx))
	testenv.WaitGroupStable(t, adm, group, 2)
	for len(joins) > 0 {
		<-joins
	}
	kill() // SIGKILL: no leave; the broker waits out its 40 s session

	// A third member joins: the group rebalances, and the indexer's
	// JoinGroup is held until the dead member's session ends.
	third, err := consoledb.NewIndexer(consoledb.IndexerConfig{Brokers: k.Brokers, Topic: topic, Group: group, Pool: pg.Pool,
		StopTimeout: 2 * time.Second})
	require.NoError(t, err)
	require.NoError(t, third.Start(ctx))
	defer third.Stop()
	select { // the indexer rejoins: its JoinGroup waits for the dead member
	case <-joins:
	case <-time.After(30 * time.Second):
		t.Fatal("the indexer never rejoined")
	}

	start := time.Now()
	x.Stop()
	took := time.Since(start)
	require.Less(t, took, 15*time.Second, "Stop within its 2 s StopTimeout (and a loaded machine's margin), not the dead member's 40 s session")
}

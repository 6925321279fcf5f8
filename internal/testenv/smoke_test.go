package testenv_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/testenv"
)

// These smoke tests prove each real dependency answers the way the rest of the
// suite relies on. They fail (never skip) when a dependency is missing.

func TestPostgresSchemaIsMigratedAndIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := testenv.Postgres(t), testenv.Postgres(t)
	require.NotEqual(t, a.Schema, b.Schema)

	_, err := a.Pool.Exec(ctx, `insert into subscribers (id, monthly_fee_cents) values (1, 1000)`)
	require.NoError(t, err)
	var n int
	require.NoError(t, b.Pool.QueryRow(ctx, `select count(*) from subscribers`).Scan(&n))
	require.Zero(t, n, "schemas must not share rows")
	require.NoError(t, a.Pool.QueryRow(ctx, `select count(*) from subscribers`).Scan(&n))
	require.Equal(t, 1, n)
}

func TestRedisEval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := testenv.Redis(t)
	// A Lua script sees the key and returns what it wrote: the primitive every lock script uses.
	script := redis.NewScript(`redis.call('SET', KEYS[1], ARGV[1], 'PX', 10000) return redis.call('GET', KEYS[1])`)
	got, err := script.Run(ctx, r.Client, []string{r.Prefix + ":smoke"}, "owner-1").Text()
	require.NoError(t, err)
	require.Equal(t, "owner-1", got)
	ttl, err := r.Client.PTTL(ctx, r.Prefix+":smoke").Result()
	require.NoError(t, err)
	require.Greater(t, ttl, time.Duration(0))
}

func TestRedisClusterAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RedisClusterAddrs(t)})
	defer c.Close()
	info, err := c.ClusterInfo(ctx).Result()
	require.NoError(t, err)
	require.Contains(t, info, "cluster_state:ok")
	var masters atomic.Int32 // ForEachMaster calls fn from one goroutine per master
	require.NoError(t, c.ForEachMaster(ctx, func(context.Context, *redis.Client) error { masters.Add(1); return nil }))
	require.GreaterOrEqual(t, masters.Load(), int32(3))
}

func TestKafkaProduceConsumeCommit(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	k := testenv.Kafka(t)
	topic, group := k.Topic("smoke"), k.Topic("smoke-group")

	admCl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	require.NoError(t, err)
	defer admCl.Close()
	adm := kadm.NewClient(admCl)
	created, err := adm.CreateTopic(ctx, 1, 1, nil, topic)
	require.NoError(t, err)
	require.NoError(t, created.Err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, topic)
	})

	prod, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	require.NoError(t, err)
	defer prod.Close()
	require.NoError(t, prod.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte("2026-11"), Value: []byte(`{"period":"2026-11"}`)}).FirstErr())

	cons, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cons.Close()
	var got *kgo.Record
	for got == nil {
		fetches := cons.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "no record within the deadline")
		require.Empty(t, fetches.Errors())
		fetches.EachRecord(func(r *kgo.Record) { got = r })
	}
	require.Equal(t, `{"period":"2026-11"}`, string(got.Value))
	require.NoError(t, cons.CommitRecords(ctx, got))

	offsets, err := adm.FetchOffsets(ctx, group)
	require.NoError(t, err)
	o, ok := offsets.Lookup(topic, 0)
	require.True(t, ok, "the group has no committed offset")
	require.EqualValues(t, 1, o.At, "committed offset is the next record to read")
}

package topics_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/topics"
)

func TestNew(t *testing.T) {
	t.Parallel()
	n := topics.New("", "a.requested", "b.requested")
	require.Equal(t, "coordinator.triggers.dlq", n.DLQ)
	require.Equal(t, "coordinator.ownership.events", n.Events)
	require.Equal(t, []string{"a.requested", "b.requested"}, n.Triggers())
	require.Equal(t, []string{"a.requested", "b.requested", "coordinator.triggers.dlq", "coordinator.ownership.events"}, n.All())
	require.Equal(t, "t1.coordinator.ownership.events", topics.New("t1").Events)
	require.Equal(t, "t1.coordinator.triggers.dlq", topics.New("t1.").DLQ)
	require.Equal(t, []string{"t1_a.requested"}, topics.New("t1_", "a.requested").Triggers())
	require.Equal(t, "t1-x", topics.New("t1-").Topic("x"))
	require.True(t, topics.Names{}.IsZero())
	require.False(t, topics.New("").IsZero())
}

func setup(t *testing.T) (*kadm.Client, topics.Names) {
	t.Helper()
	k := testenv.Kafka(t)
	adm, err := topics.Dial(k.Brokers)
	require.NoError(t, err)
	names := topics.New(k.Suffix, "test.first.requested", "test.second.requested")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, names.All()...)
		adm.Close()
	})
	return adm, names
}

func TestEnsureWithoutCreateNamesEveryMissingTopic(t *testing.T) {
	t.Parallel()
	adm, names := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// One of the four exists already, and the broker's metadata says so
	// (a create is acknowledged before every metadata view shows it).
	created, err := adm.CreateTopics(ctx, 1, -1, nil, names.Events)
	require.NoError(t, err)
	require.NoError(t, created.Error())
	require.Eventually(t, func() bool {
		details, err := adm.ListTopics(ctx, names.Events)
		return err == nil && details.Has(names.Events) && details[names.Events].Err == nil
	}, 15*time.Second, 50*time.Millisecond, "created topic never showed in metadata")

	err = topics.Ensure(ctx, adm, names, false)
	var missing *topics.MissingError
	require.ErrorAs(t, err, &missing)
	require.ErrorIs(t, err, topics.ErrMissing)
	require.ElementsMatch(t, append(names.Triggers(), names.DLQ), missing.Topics)
	for _, name := range missing.Topics {
		require.Contains(t, err.Error(), name)
	}
	require.NotContains(t, err.Error(), names.Events+",")

	// Check says the same, and nothing was created behind our back.
	err = topics.Check(ctx, adm, names)
	require.ErrorAs(t, err, &missing)
	require.Len(t, missing.Topics, 3)
}

func TestEnsureCreatesMissingTopicsAndIsIdempotent(t *testing.T) {
	t.Parallel()
	adm, names := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	require.NoError(t, topics.Ensure(ctx, adm, names, true))
	require.NoError(t, topics.Check(ctx, adm, names))

	details, err := adm.ListTopics(ctx, names.All()...)
	require.NoError(t, err)
	require.Len(t, details[names.Triggers()[0]].Partitions, 3)
	require.Len(t, details[names.DLQ].Partitions, 1)

	// Several replicas starting at once: every Ensure succeeds.
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- topics.Ensure(ctx, adm, names, true) }()
	}
	for range 3 {
		require.NoError(t, <-errs)
	}
}

func TestCheckReportsUnreachableKafka(t *testing.T) {
	t.Parallel()
	adm, err := topics.Dial([]string{"127.0.0.1:1"})
	require.NoError(t, err)
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err = topics.Check(ctx, adm, topics.New("x"))
	require.Error(t, err)
	require.False(t, errors.Is(err, topics.ErrMissing), "an unreachable broker is not a missing topic: %v", err)
	require.True(t, strings.HasPrefix(err.Error(), "topics: list"), err.Error())
}

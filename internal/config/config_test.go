package config_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/config"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestDefaults(t *testing.T) {
	t.Parallel()
	c, rest, err := config.Load("serve", nil, env(nil))
	require.NoError(t, err)
	require.Empty(t, rest)
	require.True(t, c.LockEnabled)
	require.Equal(t, "redis://127.0.0.1:6379/0", c.LockRedisURL)
	require.Equal(t, "single", c.LockRedisMode)
	require.Equal(t, 5*time.Second, c.LockWaitTime)
	require.Equal(t, 30*time.Second, c.LockWatchdogTimeout)
	require.Equal(t, []string{"127.0.0.1:9092"}, c.KafkaBrokers)
	require.True(t, c.KafkaCreateTopics)
	require.Equal(t, ":8080", c.HTTPAddr)
	require.Equal(t, "@every 30s", c.ReaperSchedule)
	require.Equal(t, 15*time.Second, c.ReaperMinHold, "half the @every interval")
	require.Empty(t, c.BillrunSchedule)
	require.NotEmpty(t, c.ReplicaID)
	require.Equal(t, "coordinator", c.KafkaGroup)
	require.Equal(t, 0, c.LockWaitReplicas, "auto")
	require.Equal(t, 200*time.Millisecond, c.LockWaitReplicasTimeout)
}

func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]int{"auto": 0, "none": -1, "2": 2} {
		c, _, err := config.Load("serve", nil, env(map[string]string{"COORDINATOR_LOCK_REDIS_WAIT_REPLICAS": v}))
		require.NoError(t, err, v)
		require.Equal(t, want, c.LockWaitReplicas, v)
	}
}

func TestFallbacksAndFlagsWin(t *testing.T) {
	t.Parallel()
	c, rest, err := config.Load("run", []string{"--lock-wait-time=2s", "billrun"}, env(map[string]string{
		"DATABASE_URL":               "postgres://u@db:5432/x",
		"REDIS_URL":                  "redis://r:6379/1",
		"COORDINATOR_LOCK_WAIT_TIME": "9s",
		"COORDINATOR_KAFKA_BROKERS":  "a:9092, b:9093",
	}))
	require.NoError(t, err)
	require.Equal(t, []string{"billrun"}, rest)
	require.Equal(t, "postgres://u@db:5432/x", c.DatabaseURL)
	require.Equal(t, "redis://r:6379/1", c.LockRedisURL)
	require.Equal(t, 2*time.Second, c.LockWaitTime, "the flag wins over the variable")
	require.Equal(t, []string{"a:9092", "b:9093"}, c.KafkaBrokers)
}

func TestInvalidValuesNameTheVariable(t *testing.T) {
	t.Parallel()
	cases := []struct{ variable, value string }{
		{"COORDINATOR_LOCK_WAIT_TIME", "banana"},
		{"COORDINATOR_LOCK_WATCHDOG_TIMEOUT", "1ms"},
		{"COORDINATOR_LOCK_ENABLED", "maybe"},
		{"COORDINATOR_LOCK_REDIS_URL", "http://x"},
		{"COORDINATOR_LOCK_REDIS_MODE", "ring"},
		{"COORDINATOR_LOCK_REDIS_WAIT_REPLICAS", "some"},
		{"COORDINATOR_LOCK_REDIS_WAIT_REPLICAS", "0"},
		{"COORDINATOR_LOCK_REDIS_WAIT_TIMEOUT", "5s"},
		{"COORDINATOR_LOCK_KEY_PREFIX", "a{b}"},
		{"COORDINATOR_KAFKA_BROKERS", "nohostport"},
		{"COORDINATOR_KAFKA_CREATE_TOPICS", "yes please"},
		{"COORDINATOR_HTTP_ADDR", "8080"},
		{"COORDINATOR_REAPER_SCHEDULE", "every now and then"},
		{"COORDINATOR_BILLRUN_SCHEDULE", "61 * * * *"},
		{"COORDINATOR_DATABASE_URL", "mysql://x"},
		{"COORDINATOR_BILLRUN_WORKERS", "0"},
		{"COORDINATOR_KAFKA_TOPIC_PREFIX", "bad prefix"},
	}
	for _, tc := range cases {
		t.Run(tc.variable, func(t *testing.T) {
			t.Parallel()
			_, _, err := config.Load("serve", nil, env(map[string]string{tc.variable: tc.value}))
			var cerr *config.Error
			require.True(t, errors.As(err, &cerr), "got %v", err)
			require.Equal(t, tc.variable, cerr.Variable)
			require.Contains(t, err.Error(), tc.variable)
			require.Contains(t, err.Error(), tc.value)
		})
	}
}

func TestSecretsAreRedacted(t *testing.T) {
	t.Parallel()
	_, _, err := config.Load("serve", nil, env(map[string]string{"COORDINATOR_LOCK_REDIS_URL": "http://:hunter2@x"}))
	require.Error(t, err)
	require.NotContains(t, err.Error(), "hunter2")
}

func TestCronSpecsAcceptSecondsAndTZ(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"@every 30s", "*/10 * * * * *", "0 2 1 * *", "CRON_TZ=Europe/Berlin 0 2 1 * *"} {
		_, err := config.CronParser.Parse(spec)
		require.NoError(t, err, spec)
	}
}

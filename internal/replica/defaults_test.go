package replica_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/console"
	"github.com/telco-platform/coordinator/internal/health"
	"github.com/telco-platform/coordinator/internal/kinds"
	"github.com/telco-platform/coordinator/internal/msisdnreaper"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/trigger"
)

// Every documented default (the settings table, which -h and
// docs/configuration.md show) is the default of the package that uses the
// setting, where that package has one: the two are written twice, and this
// test ties them. A setting whose default is the process's own choice (no
// package default: a listen address, the topics' creation) is listed as
// such, so a new setting must be placed in one list or the other.
func TestDocumentedDefaultsAreThePackagesDefaults(t *testing.T) {
	t.Parallel()
	cfg, _, err := config.Load("coordinator", nil, func(string) string { return "" })
	require.NoError(t, err)
	kc := kinds.ConfigOf(cfg)

	// The process's value with nothing set, and the package's default.
	tied := map[string][2]any{
		"COORDINATOR_LOCK_KEY_PREFIX":                    {cfg.Lock.KeyPrefix, redislock.DefaultPrefix},
		"COORDINATOR_LOCK_WAIT_TIME":                     {cfg.Lock.WaitTime, ownership.DefaultWaitTime},
		"COORDINATOR_LOCK_WATCHDOG_TIMEOUT":              {cfg.Lock.WatchdogTimeout, ownership.DefaultWatchdogTimeout},
		"COORDINATOR_LOCK_REDIS_WAIT_TIMEOUT":            {cfg.Lock.WaitReplicasTimeout, redislock.DefaultReplicaTimeout},
		"COORDINATOR_LOCK_REDIS_WAIT_REPLICAS":           {cfg.Lock.WaitReplicas, 0}, // redislock.Config.WaitReplicas: 0 is auto
		"COORDINATOR_KAFKA_MAX_DECOMPRESSED_BATCH_BYTES": {cfg.Kafka.MaxDecompressedBatchBytes, trigger.DefaultMaxDecompressBatchBytes},
		"COORDINATOR_HEALTH_CHECK_INTERVAL":              {cfg.HealthCheckInterval, health.DefaultInterval},
		"COORDINATOR_REAPER_LEASE":                       {cfg.Reaper.Lease, msisdnreaper.DefaultLease},
		"COORDINATOR_REAPER_BATCH_SIZE":                  {cfg.Reaper.BatchSize, msisdnreaper.DefaultBatchSize},
		// Unset: the reaper's own default, half an @every schedule's interval.
		"COORDINATOR_REAPER_MIN_HOLD":            {kc.Reaper.MinHold, msisdnreaper.Config{}.MinHold},
		"COORDINATOR_BILLRUN_BATCH_SIZE":         {cfg.Billrun.BatchSize, billrun.DefaultBatchSize},
		"COORDINATOR_BILLRUN_WORKERS":            {cfg.Billrun.Workers, billrun.DefaultWorkers},
		"COORDINATOR_BILLRUN_MAX_AGE_MONTHS":     {cfg.Billrun.MaxAgeMonths, billrun.DefaultMaxAgeMonths},
		"COORDINATOR_BILLRUN_SCHEDULE":           {kc.Billrun.Schedule, billrun.Config{}.Schedule},
		"COORDINATOR_BILLING_TZ":                 {cfg.Billrun.Zone.String(), "UTC"}, // billrun.Calendar's zero Zone
		"COORDINATOR_RESUME_INTERVAL":            {cfg.Resume.Interval, owned.DefaultResumeInterval},
		"COORDINATOR_RESUME_MAX_ATTEMPTS":        {cfg.Resume.MaxAttempts, owned.DefaultResumeMaxAttempts},
		"COORDINATOR_EVENTS_REPUBLISH_AFTER":     {cfg.Resume.RepublishAfter, owned.DefaultRepublishAfter},
		"COORDINATOR_PROGRESS_INTERVAL":          {cfg.ProgressInterval, owned.DefaultProgressInterval},
		"COORDINATOR_KAFKA_SESSION_TIMEOUT":      {cfg.Kafka.SessionTimeout, config.DefaultKafkaSessionTimeout},
		"COORDINATOR_CRON_JITTER":                {cfg.Cron.Jitter, trigger.CronConfig{}.Jitter},
		"COORDINATOR_CONSOLE_SESSION_TTL":        {cfg.Console.SessionTTL, console.DefaultSessionTTL},
		"COORDINATOR_CONSOLE_RETENTION":          {cfg.Console.Retention, console.DefaultRetention},
		"COORDINATOR_CONSOLE_HEARTBEAT_INTERVAL": {cfg.Console.HeartbeatInterval, console.DefaultHeartbeatInterval},
		"COORDINATOR_CONSOLE_MAX_STREAMS":        {cfg.Console.MaxStreams, console.DefaultMaxStreams},
		"COORDINATOR_CONSOLE_ENABLED":            {cfg.Console.Enabled, true},
		"COORDINATOR_LOCK_LAYOUT":                {cfg.Lock.Layout, string(redislock.LayoutCoordinator)},
		"COORDINATOR_LOCK_REDIS_MODE":            {cfg.Lock.RedisMode, redislock.ModeSingle},
		"COORDINATOR_LOCK_REDIS_URL":             {cfg.Lock.RedisURL, "redis://127.0.0.1:6379/0"},     // go-redis' own default address
		"COORDINATOR_KAFKA_BROKERS":              {fmt.Sprint(cfg.Kafka.Brokers), "[127.0.0.1:9092]"}, // franz-go's own default broker
		"COORDINATOR_REAPER_SCHEDULE":            {cfg.Reaper.Schedule, "@every 30s"},                 // the contract's (docs/contract.md)
		"COORDINATOR_KAFKA_GROUP":                {cfg.Kafka.Group, "coordinator"},                    // the contract's
		"COORDINATOR_CRON_CATCHUP_WINDOW":        {cfg.Cron.CatchUpWindow.String(), "6h0m0s"},         // trigger.CronConfig: 0 (off) for a library user
		"COORDINATOR_MAX_RUNS_IN_FLIGHT":         {cfg.HTTP.MaxRunsInFlight, 8},                       // trigger.DispatcherConfig: 0 (no cap) for a library user
		"COORDINATOR_SHUTDOWN_TIMEOUT":           {cfg.ShutdownTimeout.String(), "30s"},
		"COORDINATOR_LOG_LEVEL":                  {cfg.Log.Level, "info"},
		"COORDINATOR_LOG_FORMAT":                 {cfg.Log.Format, "text"},
		"COORDINATOR_HTTP_ADDR":                  {cfg.HTTP.Addr, ":8080"},
		"COORDINATOR_LOCK_ENABLED":               {cfg.Lock.Enabled, true},
		"COORDINATOR_KAFKA_CREATE_TOPICS":        {cfg.Kafka.CreateTopics, true},
		"COORDINATOR_KAFKA_TLS":                  {cfg.Kafka.TLSEnabled(), false},
	}
	// Settings with no default value: unset unless given (secrets, files,
	// the replica id derived from the host).
	unset := map[string]bool{"COORDINATOR_DATABASE_URL": true, "COORDINATOR_REPLICA_ID": true, "COORDINATOR_ADMIN_TOKEN": true,
		"COORDINATOR_ADMIN_TOKENS_FILE": true, "COORDINATOR_KAFKA_TOPIC_PREFIX": true, "COORDINATOR_KAFKA_SASL_MECHANISM": true,
		"COORDINATOR_KAFKA_SASL_USERNAME": true, "COORDINATOR_KAFKA_SASL_PASSWORD": true, "COORDINATOR_KAFKA_TLS_CA_FILE": true,
		"COORDINATOR_KAFKA_TLS_CERT_FILE": true, "COORDINATOR_KAFKA_TLS_KEY_FILE": true, "COORDINATOR_LOCK_REDIS_PASSWORD_FILE": true,
		"COORDINATOR_LOCK_REDIS_TLS_CA_FILE": true, "COORDINATOR_LOCK_REDIS_TLS_CERT_FILE": true, "COORDINATOR_LOCK_REDIS_TLS_KEY_FILE": true}

	for _, s := range config.Settings() {
		pair, ok := tied[s.Env]
		if !ok {
			require.True(t, unset[s.Env], "%s: tie its default to the package's (or list it as unset)", s.Env)
			require.Empty(t, s.Default, "%s has a default: tie it", s.Env)
			continue
		}
		require.Equal(t, pair[1], pair[0], "%s: the documented default (%q) is not the package's", s.Env, s.Default)
		delete(tied, s.Env)
	}
	require.Empty(t, tied, "settings that no longer exist")
}

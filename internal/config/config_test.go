package config_test

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/adminauth"
	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/cronspec"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestDefaults(t *testing.T) {
	t.Parallel()
	c, rest, err := config.Load("serve", nil, env(nil))
	require.NoError(t, err)
	require.Empty(t, rest)
	require.True(t, c.Lock.Enabled)
	require.Equal(t, "redis://127.0.0.1:6379/0", c.Lock.RedisURL)
	require.Equal(t, "single", c.Lock.RedisMode)
	require.Equal(t, 5*time.Second, c.Lock.WaitTime)
	require.Equal(t, 30*time.Second, c.Lock.WatchdogTimeout)
	require.Equal(t, []string{"127.0.0.1:9092"}, c.Kafka.Brokers)
	require.True(t, c.Kafka.CreateTopics)
	require.Equal(t, ":8080", c.HTTP.Addr)
	require.Equal(t, "@every 30s", c.Reaper.Schedule)
	require.Nil(t, c.Reaper.MinHold, "the reaper's default (half the @every interval)")
	require.Empty(t, c.Billrun.Schedule)
	require.Equal(t, "UTC", c.Billrun.Zone.String())
	require.Equal(t, 24, c.Billrun.MaxAgeMonths)
	require.NotEmpty(t, c.ReplicaID)
	require.Equal(t, "coordinator", c.Kafka.Group)
	require.Equal(t, 0, c.Lock.WaitReplicas, "auto")
	require.Equal(t, 200*time.Millisecond, c.Lock.WaitReplicasTimeout)
	require.Equal(t, 8<<20, c.Kafka.MaxDecompressedBatchBytes)
	require.Equal(t, 6*time.Hour, c.Cron.CatchUpWindow)
	require.Zero(t, c.Cron.Jitter)
	require.Equal(t, "coordinator", c.Lock.Layout)
}

func TestLockLayout(t *testing.T) {
	t.Parallel()
	c, _, err := config.Load("serve", nil, env(map[string]string{"COORDINATOR_LOCK_LAYOUT": "redisson"}))
	require.NoError(t, err)
	require.Equal(t, config.LockLayoutRedisson, c.Lock.Layout)
	c, _, err = config.Load("lock", []string{"--lock-layout=redisson"}, env(nil))
	require.NoError(t, err)
	require.Equal(t, config.LockLayoutRedisson, c.Lock.Layout)
}

func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]int{"auto": 0, "none": -1, "2": 2} {
		c, _, err := config.Load("serve", nil, env(map[string]string{"COORDINATOR_LOCK_REDIS_WAIT_REPLICAS": v}))
		require.NoError(t, err, v)
		require.Equal(t, want, c.Lock.WaitReplicas, v)
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
	require.Equal(t, "redis://r:6379/1", c.Lock.RedisURL)
	require.Equal(t, 2*time.Second, c.Lock.WaitTime, "the flag wins over the variable")
	require.Equal(t, []string{"a:9092", "b:9093"}, c.Kafka.Brokers)
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
		{"COORDINATOR_LOCK_LAYOUT", "Redisson"},
		{"COORDINATOR_KAFKA_BROKERS", "nohostport"},
		{"COORDINATOR_KAFKA_CREATE_TOPICS", "yes please"},
		{"COORDINATOR_HTTP_ADDR", "8080"},
		{"COORDINATOR_REAPER_SCHEDULE", "every now and then"},
		{"COORDINATOR_BILLRUN_SCHEDULE", "61 * * * *"},
		{"COORDINATOR_DATABASE_URL", "mysql://x"},
		{"COORDINATOR_BILLRUN_WORKERS", "0"},
		{"COORDINATOR_BILLING_TZ", "Mars/Olympus"},
		{"COORDINATOR_BILLING_TZ", "Local"},
		{"COORDINATOR_BILLRUN_MAX_AGE_MONTHS", "0"},
		{"COORDINATOR_KAFKA_TOPIC_PREFIX", "bad prefix"},
		{"COORDINATOR_KAFKA_MAX_DECOMPRESSED_BATCH_BYTES", "1024"},
		{"COORDINATOR_KAFKA_MAX_DECOMPRESSED_BATCH_BYTES", "8MiB"},
		{"COORDINATOR_CRON_CATCHUP_WINDOW", "-1h"},
		{"COORDINATOR_CRON_CATCHUP_WINDOW", "800h"},
		{"COORDINATOR_CRON_JITTER", "1h"},
		// Integers are base 10 only: 010 was read as 10 here, and as 8 by
		// Go's flag.Int.
		{"COORDINATOR_BILLRUN_WORKERS", "010"},
		{"COORDINATOR_REAPER_BATCH_SIZE", "0x10"},
		{"COORDINATOR_MAX_RUNS_IN_FLIGHT", "0b11"},
		{"COORDINATOR_KAFKA_MAX_DECOMPRESSED_BATCH_BYTES", "010485760"},
		{"COORDINATOR_LOCK_REDIS_WAIT_REPLICAS", "02"},
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
		_, err := cronspec.Parse(spec)
		require.NoError(t, err, spec)
	}
}

func TestSecretFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	token := strings.Repeat("t", 40)
	c, _, err := config.Load("serve", nil, env(map[string]string{
		"COORDINATOR_DATABASE_URL_FILE":        write("db", "postgres://app:p%40ss@db:5432/x?sslmode=verify-full\n"),
		"COORDINATOR_LOCK_REDIS_URL_FILE":      write("redis", "rediss://coordinator@r:6380/0\r\n"),
		"COORDINATOR_LOCK_REDIS_PASSWORD_FILE": write("redispw", "redis-secret\n"),
		"COORDINATOR_ADMIN_TOKEN_FILE":         write("token", token+"\n"),
		"COORDINATOR_KAFKA_SASL_MECHANISM":     "scram-sha-512",
		"COORDINATOR_KAFKA_SASL_USERNAME":      "coordinator",
		"COORDINATOR_KAFKA_SASL_PASSWORD_FILE": write("kafkapw", "kafka-secret"),
	}))
	require.NoError(t, err)
	require.Equal(t, "postgres://app:p%40ss@db:5432/x?sslmode=verify-full", c.DatabaseURL, "one final newline dropped")
	require.Equal(t, "rediss://coordinator@r:6380/0", c.Lock.RedisURL)
	require.Equal(t, "redis-secret", c.Lock.RedisPassword)
	require.Equal(t, token, c.HTTP.AdminToken)
	require.Equal(t, "SCRAM-SHA-512", c.Kafka.SASLMechanism)
	require.Equal(t, "kafka-secret", c.Kafka.SASLPassword)

	// The flag form of a _FILE variable is allowed: it names a path, not a secret.
	c, _, err = config.Load("serve", []string{"--admin-token-file", write("token2", token)}, env(nil))
	require.NoError(t, err)
	require.Equal(t, token, c.HTTP.AdminToken)

	for _, tc := range []struct {
		name     string
		env      map[string]string
		variable string
		want     string
	}{
		{"both set", map[string]string{"COORDINATOR_ADMIN_TOKEN": token, "COORDINATOR_ADMIN_TOKEN_FILE": write("t3", token)},
			"COORDINATOR_ADMIN_TOKEN_FILE", "COORDINATOR_ADMIN_TOKEN is set too"},
		{"missing file", map[string]string{"COORDINATOR_DATABASE_URL_FILE": filepath.Join(dir, "nope")},
			"COORDINATOR_DATABASE_URL_FILE", "no such file"},
		{"empty file", map[string]string{"COORDINATOR_KAFKA_SASL_PASSWORD_FILE": write("empty", "\n")},
			"COORDINATOR_KAFKA_SASL_PASSWORD_FILE", "empty"},
		{"short token from a file", map[string]string{"COORDINATOR_ADMIN_TOKEN_FILE": write("short", "CHANGE-ME\n")},
			"COORDINATOR_ADMIN_TOKEN_FILE", "at least 32 bytes"},
	} {
		_, _, err := config.Load("serve", nil, env(tc.env))
		var cerr *config.Error
		require.True(t, errors.As(err, &cerr), "%s: %v", tc.name, err)
		require.Equal(t, tc.variable, cerr.Variable, tc.name)
		require.ErrorContains(t, err, tc.want, tc.name)
		require.NotContains(t, err.Error(), token, tc.name)
		require.NotContains(t, err.Error(), "CHANGE-ME", tc.name)
	}
}

func TestAdminTokenLength(t *testing.T) {
	t.Parallel()
	for _, tok := range []string{"CHANGE-ME", "change-me", strings.Repeat("x", config.MinAdminTokenBytes-1)} {
		_, _, err := config.Load("serve", nil, env(map[string]string{"COORDINATOR_ADMIN_TOKEN": tok}))
		var cerr *config.Error
		require.True(t, errors.As(err, &cerr), "%q: %v", tok, err)
		require.Equal(t, "COORDINATOR_ADMIN_TOKEN", cerr.Variable)
		require.ErrorContains(t, err, "at least 32 bytes")
		require.NotContains(t, err.Error(), tok)
	}
	c, _, err := config.Load("serve", nil, env(map[string]string{"COORDINATOR_ADMIN_TOKEN": strings.Repeat("x", config.MinAdminTokenBytes)}))
	require.NoError(t, err)
	require.Len(t, c.HTTP.AdminToken, config.MinAdminTokenBytes)
}

func TestAdminTokensFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	single, ops, grafana := strings.Repeat("s", 40), strings.Repeat("o", 40), strings.Repeat("g", 40)
	file := write("tokens", "# name:scopes:token\nbilling-ops:read,mutate:"+ops+"\ngrafana:read:"+grafana+"\n")
	c, _, err := config.Load("serve", nil, env(map[string]string{"COORDINATOR_ADMIN_TOKEN": single, "COORDINATOR_ADMIN_TOKENS_FILE": file}))
	require.NoError(t, err)
	require.Equal(t, []adminauth.Token{
		{Name: "admin", Scopes: adminauth.All, Secret: single},
		{Name: "billing-ops", Scopes: adminauth.All, Secret: ops},
		{Name: "grafana", Scopes: adminauth.Read, Secret: grafana},
	}, c.HTTP.AdminTokenSet())

	c, _, err = config.Load("serve", []string{"--admin-tokens-file", file}, env(nil))
	require.NoError(t, err)
	require.Len(t, c.HTTP.AdminTokenSet(), 2, "the file alone, without COORDINATOR_ADMIN_TOKEN")

	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    string
		secrets []string
	}{
		{"short token", map[string]string{"COORDINATOR_ADMIN_TOKENS_FILE": write("short", "ci:mutate:CHANGE-ME\n")},
			"line 1 (ci): the token must be at least 32 bytes", []string{"CHANGE-ME"}},
		{"bad scope", map[string]string{"COORDINATOR_ADMIN_TOKENS_FILE": write("scope", "\nci:write:"+ops)},
			"line 2 (ci): unknown scope", []string{ops}},
		{"empty", map[string]string{"COORDINATOR_ADMIN_TOKENS_FILE": write("empty", "")}, "empty", nil},
		{"name admin taken", map[string]string{"COORDINATOR_ADMIN_TOKEN": single, "COORDINATOR_ADMIN_TOKENS_FILE": write("admin", "admin:read:"+ops)},
			`two tokens are named "admin"`, []string{single, ops}},
		{"same token twice", map[string]string{"COORDINATOR_ADMIN_TOKEN": single, "COORDINATOR_ADMIN_TOKENS_FILE": write("dup", "ro:read:"+single)},
			`tokens "admin" and "ro" are the same token`, []string{single}},
	} {
		_, _, err := config.Load("serve", nil, env(tc.env))
		var cerr *config.Error
		require.True(t, errors.As(err, &cerr), "%s: %v", tc.name, err)
		require.Equal(t, "COORDINATOR_ADMIN_TOKENS_FILE", cerr.Variable, tc.name)
		require.ErrorContains(t, err, tc.want, tc.name)
		for _, s := range tc.secrets {
			require.NotContains(t, err.Error(), s, tc.name)
		}
	}
}

func TestRunCapAndHealthInterval(t *testing.T) {
	t.Parallel()
	c, _, err := config.Load("serve", nil, env(nil))
	require.NoError(t, err)
	require.Equal(t, 8, c.HTTP.MaxRunsInFlight)
	require.Equal(t, 10*time.Second, c.HealthCheckInterval)
	c, _, err = config.Load("serve", []string{"--max-runs-in-flight=2", "--health-check-interval=500ms"}, env(nil))
	require.NoError(t, err)
	require.Equal(t, 2, c.HTTP.MaxRunsInFlight)
	require.Equal(t, 500*time.Millisecond, c.HealthCheckInterval)
	for v, bad := range map[string]string{"COORDINATOR_MAX_RUNS_IN_FLIGHT": "0", "COORDINATOR_HEALTH_CHECK_INTERVAL": "1ms"} {
		_, _, err := config.Load("serve", nil, env(map[string]string{v: bad}))
		var cerr *config.Error
		require.True(t, errors.As(err, &cerr), "%s: %v", v, err)
		require.Equal(t, v, cerr.Variable)
	}
}

func TestSecretsRefusedOnTheCommandLine(t *testing.T) {
	t.Parallel()
	token := strings.Repeat("s", 40)
	for _, tc := range []struct {
		args     []string
		variable string
	}{
		{[]string{"--admin-token", token}, "COORDINATOR_ADMIN_TOKEN"},
		{[]string{"--kafka-sasl-password", "hunter2"}, "COORDINATOR_KAFKA_SASL_PASSWORD"},
		{[]string{"--database-url", "postgres://app:hunter2@db/x"}, "COORDINATOR_DATABASE_URL"},
		{[]string{"--lock-redis-url", "redis://:hunter2@r:6379/0"}, "COORDINATOR_LOCK_REDIS_URL"},
		{[]string{"--lock-redis-url", "redis://s:6379/0?master_name=m&password=hunter2", "--lock-redis-mode", "sentinel"}, "COORDINATOR_LOCK_REDIS_URL"},
	} {
		_, _, err := config.Load("serve", tc.args, env(nil))
		var cerr *config.Error
		require.True(t, errors.As(err, &cerr), "%v: %v", tc.args, err)
		require.Equal(t, tc.variable, cerr.Variable)
		require.ErrorContains(t, err, "/proc/PID/cmdline")
		require.ErrorContains(t, err, tc.variable+"_FILE")
		require.NotContains(t, err.Error(), "hunter2")
		require.NotContains(t, err.Error(), token)
	}
	// URLs without a password are fine as flags.
	c, _, err := config.Load("serve", []string{"--database-url", "postgres://app@db/x?sslmode=verify-full",
		"--lock-redis-url", "rediss://coordinator@r:6380/0"}, env(nil))
	require.NoError(t, err)
	require.Equal(t, "postgres://app@db/x?sslmode=verify-full", c.DatabaseURL)
}

func TestKafkaSecuritySettings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, _, _ := testenv.ForeignTLS(t) // any PEM CA certificate

	c, _, err := config.Load("serve", nil, env(map[string]string{"COORDINATOR_KAFKA_TLS_CA_FILE": ca}))
	require.NoError(t, err)
	require.True(t, c.Kafka.TLSEnabled(), "a CA file turns TLS on")
	require.Equal(t, ca, c.Kafka.TLSCAFile)
	c, _, err = config.Load("serve", nil, env(map[string]string{"COORDINATOR_KAFKA_TLS": "true"}))
	require.NoError(t, err)
	require.True(t, c.Kafka.TLSEnabled(), "TLS with the system roots")
	c, _, err = config.Load("serve", nil, env(nil))
	require.NoError(t, err)
	require.False(t, c.Kafka.TLSEnabled())

	for _, tc := range []struct {
		env      map[string]string
		variable string
		want     string
	}{
		{map[string]string{"COORDINATOR_KAFKA_SASL_MECHANISM": "GSSAPI"}, "COORDINATOR_KAFKA_SASL_MECHANISM", "must be one of"},
		{map[string]string{"COORDINATOR_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "COORDINATOR_KAFKA_SASL_PASSWORD": "pw"}, "COORDINATOR_KAFKA_SASL_USERNAME", "required"},
		{map[string]string{"COORDINATOR_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "COORDINATOR_KAFKA_SASL_USERNAME": "u"}, "COORDINATOR_KAFKA_SASL_PASSWORD", "required"},
		{map[string]string{"COORDINATOR_KAFKA_SASL_USERNAME": "u"}, "COORDINATOR_KAFKA_SASL_MECHANISM", "required"},
		{map[string]string{"COORDINATOR_KAFKA_SASL_MECHANISM": "PLAIN", "COORDINATOR_KAFKA_SASL_USERNAME": "u", "COORDINATOR_KAFKA_SASL_PASSWORD": "pw"},
			"COORDINATOR_KAFKA_SASL_MECHANISM", "clear text"},
		{map[string]string{"COORDINATOR_KAFKA_TLS": "false", "COORDINATOR_KAFKA_TLS_CA_FILE": ca}, "COORDINATOR_KAFKA_TLS", "contradicts"},
		{map[string]string{"COORDINATOR_KAFKA_TLS_CA_FILE": filepath.Join(dir, "missing.crt")}, "COORDINATOR_KAFKA_TLS_CA_FILE", "no such file"},
		{map[string]string{"COORDINATOR_KAFKA_TLS_CA_FILE": filepath.Join("testdata", "not-pem.txt")}, "COORDINATOR_KAFKA_TLS_CA_FILE", "no PEM certificate"},
		{map[string]string{"COORDINATOR_KAFKA_TLS_CERT_FILE": ca}, "COORDINATOR_KAFKA_TLS_KEY_FILE", "required with COORDINATOR_KAFKA_TLS_CERT_FILE"},
		{map[string]string{"COORDINATOR_LOCK_REDIS_TLS_CA_FILE": ca}, "COORDINATOR_LOCK_REDIS_URL", "rediss://"},
		{map[string]string{"COORDINATOR_LOCK_REDIS_URL": "rediss://r:6380/0", "COORDINATOR_LOCK_REDIS_TLS_KEY_FILE": ca}, "COORDINATOR_LOCK_REDIS_TLS_CERT_FILE", "required"},
	} {
		_, _, err := config.Load("serve", nil, env(tc.env))
		var cerr *config.Error
		require.True(t, errors.As(err, &cerr), "%v: %v", tc.env, err)
		require.Equal(t, tc.variable, cerr.Variable, "%v: %v", tc.env, err)
		require.ErrorContains(t, err, tc.want)
		require.NotContains(t, err.Error(), `"pw"`)
	}
}

// The shapes of secret that used to be echoed: a DSN whose password holds a
// '%' or '#' (url.Parse fails and quoted the whole DSN), a sentinel password,
// an unknown option's value. (The Redis URL's, which go-redis parses, are
// cmd/coordinator's TestLockURLSecretsNeverEchoed.)
func TestSecretsNeverEchoed(t *testing.T) {
	t.Parallel()
	for _, e := range []map[string]string{
		{"COORDINATOR_DATABASE_URL": "postgres://app:Hunter2%zz@db/x"},
		{"COORDINATOR_DATABASE_URL": "postgres://app:Hunter2#x@db/x"},
		{"COORDINATOR_DATABASE_URL": "mysql://app:Hunter2@db/x"},
		{"COORDINATOR_LOCK_REDIS_URL": "http://:Hunter2@r:6379/0"},
	} {
		_, _, err := config.Load("serve", nil, env(e))
		require.Error(t, err, "%v", e)
		require.NotContains(t, err.Error(), "Hunter2", "%v", e)
		require.NotContains(t, err.Error(), "s3nt", "%v", e)
	}
}

// FuzzSecretsNeverEchoed: whatever a secret setting holds, a config error
// never shows it. The secret is framed by markers that appear nowhere else,
// so a leak of its start or end is caught even when the middle is mangled.
func FuzzSecretsNeverEchoed(f *testing.F) {
	for _, s := range []string{"hunter2", "p%zz", "a#b", "a@b/c?d", "", "%", ",x:1", "&password=x", "\n"} {
		f.Add(s, uint8(0))
	}
	f.Fuzz(func(t *testing.T, fuzz string, which uint8) {
		secret := "S3CR" + fuzz + "T0P"
		settings := []map[string]string{
			{"COORDINATOR_DATABASE_URL": "postgres://app:" + secret + "@db:5432/x"},
			{"COORDINATOR_DATABASE_URL": "host=db password=" + secret},
			{"COORDINATOR_LOCK_REDIS_URL": "redis://:" + secret + "@r:6379/0"},
			{"COORDINATOR_LOCK_REDIS_URL": "rediss://u:" + secret + "@r:6380/0?" + fuzz, "COORDINATOR_LOCK_REDIS_MODE": "cluster"},
			{"COORDINATOR_LOCK_REDIS_URL": "redis://s:" + secret + "@s:26379/0?master_name=m&password=" + secret + "&" + fuzz, "COORDINATOR_LOCK_REDIS_MODE": "sentinel"},
			{"COORDINATOR_LOCK_REDIS_URL": "redis://r:6379/0?opt_" + fuzz + "=" + secret},
			{"COORDINATOR_ADMIN_TOKEN": secret},
			{"COORDINATOR_KAFKA_SASL_PASSWORD": secret, "COORDINATOR_KAFKA_SASL_MECHANISM": "PLAIN", "COORDINATOR_KAFKA_SASL_USERNAME": "u"},
		}
		e := settings[int(which)%len(settings)]
		_, _, err := config.Load("serve", nil, env(e))
		if err != nil && (strings.Contains(err.Error(), "S3CR") || strings.Contains(err.Error(), "T0P")) {
			t.Fatalf("%v: error shows the secret: %v", e, err)
		}
		// Nor on the command line, where it is refused.
		for k, v := range e {
			if !strings.HasPrefix(k, "COORDINATOR_") || v != e[k] {
				continue
			}
			flagName := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(k, "COORDINATOR_")), "_", "-")
			_, _, err := config.Load("serve", []string{"--" + flagName + "=" + v}, env(nil))
			if err != nil && (strings.Contains(err.Error(), "S3CR") || strings.Contains(err.Error(), "T0P")) {
				t.Fatalf("--%s: error shows the secret: %v", flagName, err)
			}
		}
	})
}

// -h shows each flag's type from the settings table itself: the parser a
// setting is made with gives its type, so none can drift (the hand-kept
// table showed `string` for four duration and integer flags).
func TestHelpShowsEachSettingsType(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	config.Bind(fs, env(nil))
	for _, s := range config.Settings() {
		f := fs.Lookup(s.Flag)
		require.NotNil(t, f, s.Flag)
		typ, _ := flag.UnquoteUsage(f)
		if s.Type == "bool" {
			require.Empty(t, typ, "%s: a bool flag takes no argument", s.Flag)
			continue
		}
		require.Equal(t, s.Type, typ, s.Flag)
	}
	for name, want := range map[string]string{"progress-interval": "duration", "lock-redis-wait-timeout": "duration",
		"events-republish-after": "duration", "billrun-max-age-months": "int", "reaper-batch-size": "int"} {
		typ, _ := flag.UnquoteUsage(fs.Lookup(name))
		require.Equal(t, want, typ, name)
	}
}

// A flag's integer is read like its variable's: base 10 only, and the
// error names the variable and the flag.
func TestIntegerFlagsAreBase10(t *testing.T) {
	t.Parallel()
	_, _, err := config.Load("serve", []string{"--billrun-workers", "010"}, env(nil))
	var cerr *config.Error
	require.ErrorAs(t, err, &cerr)
	require.Equal(t, "COORDINATOR_BILLRUN_WORKERS", cerr.Variable)
	require.Equal(t, "billrun-workers", cerr.Flag)
	require.ErrorContains(t, err, "base-10")
	c, _, err := config.Load("serve", []string{"--billrun-workers", "10"}, env(nil))
	require.NoError(t, err)
	require.Equal(t, 10, c.Billrun.Workers)
}

// lookup is an environment that tells an empty variable from an unset one.
func lookup(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// COORDINATOR_REAPER_SCHEDULE="" disables the reaper, as configuration.md
// says; it used to be taken for unset, and the default @every 30s ran.
// Unset is still the default, and other settings still take an empty
// variable for unset.
func TestAnEmptyReaperScheduleDisablesIt(t *testing.T) {
	t.Parallel()
	e := map[string]string{"COORDINATOR_REAPER_SCHEDULE": "", "COORDINATOR_LOCK_WAIT_TIME": ""}
	c, _, err := config.Load("serve", nil, env(e), config.WithLookup(lookup(e)))
	require.NoError(t, err)
	require.Empty(t, c.Reaper.Schedule, "set, and empty: no reaper")
	require.Equal(t, 5*time.Second, c.Lock.WaitTime, "an empty variable of another setting is unset")
	c, _, err = config.Load("serve", nil, env(nil), config.WithLookup(lookup(nil)))
	require.NoError(t, err)
	require.Equal(t, "@every 30s", c.Reaper.Schedule, "unset: the default")
	c, _, err = config.Load("serve", []string{"--reaper-schedule="}, env(nil), config.WithLookup(lookup(nil)))
	require.NoError(t, err)
	require.Empty(t, c.Reaper.Schedule, "the flag too")
}

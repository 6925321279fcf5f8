package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/job"
)

func TestServeRejectsBadConfigBeforeTouchingServices(t *testing.T) {
	t.Parallel()
	// Every address points where nothing listens: a config error must come
	// first, with exit 64 (a failed dial would be 69) and a message naming
	// the variable and the value.
	base := map[string]string{
		"COORDINATOR_DATABASE_URL":   "postgres://u@127.0.0.1:1/x",
		"COORDINATOR_LOCK_REDIS_URL": "redis://127.0.0.1:1/0",
		"COORDINATOR_KAFKA_BROKERS":  "127.0.0.1:1",
	}
	tokensFile := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokensFile, []byte("# name:scopes:token\nci:mutate:CHANGE-ME\n"), 0o600))
	with := func(k, v string) map[string]string {
		env := map[string]string{k: v}
		for bk, bv := range base {
			if bk != k {
				env[bk] = bv
			}
		}
		return env
	}
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{"bad wait time", with("COORDINATOR_LOCK_WAIT_TIME", "banana"), nil, []string{"COORDINATOR_LOCK_WAIT_TIME", "banana"}},
		{"bad lock layout", with("COORDINATOR_LOCK_LAYOUT", "redlock"), nil, []string{"COORDINATOR_LOCK_LAYOUT", "redlock", "coordinator, redisson"}},
		{"bad lock layout flag", base, []string{"--lock-layout", "jedis"}, []string{"COORDINATOR_LOCK_LAYOUT", "jedis"}},
		{"bad schedule", with("COORDINATOR_REAPER_SCHEDULE", "every tuesday"), nil, []string{"COORDINATOR_REAPER_SCHEDULE", "every tuesday"}},
		{"bad http addr", with("COORDINATOR_HTTP_ADDR", "nowhere"), nil, []string{"COORDINATOR_HTTP_ADDR"}},
		{"bad flag value", base, []string{"--shutdown-timeout", "soon"}, []string{"COORDINATOR_SHUTDOWN_TIMEOUT", "soon"}},
		{"no database", with("COORDINATOR_DATABASE_URL", ""), nil, []string{"COORDINATOR_DATABASE_URL"}},
		{"stray argument", base, []string{"now"}, []string{"unexpected arguments"}},
		{"short admin token", with("COORDINATOR_ADMIN_TOKEN", "CHANGE-ME"), nil, []string{"COORDINATOR_ADMIN_TOKEN", "at least 32 bytes"}},
		{"bad admin tokens file", with("COORDINATOR_ADMIN_TOKENS_FILE", tokensFile), nil,
			[]string{"COORDINATOR_ADMIN_TOKENS_FILE", "line 2 (ci): the token must be at least 32 bytes"}},
		{"bad run cap", with("COORDINATOR_MAX_RUNS_IN_FLIGHT", "0"), nil, []string{"COORDINATOR_MAX_RUNS_IN_FLIGHT"}},
		{"watchdog and wait reach the session timeout", with("COORDINATOR_LOCK_WATCHDOG_TIMEOUT", "40s"), nil,
			[]string{"COORDINATOR_LOCK_WATCHDOG_TIMEOUT", "COORDINATOR_LOCK_WAIT_TIME", "COORDINATOR_KAFKA_SESSION_TIMEOUT", "45s"}},
		{"session timeout below watchdog and wait", with("COORDINATOR_KAFKA_SESSION_TIMEOUT", "20s"), nil,
			[]string{"COORDINATOR_LOCK_WATCHDOG_TIMEOUT", "COORDINATOR_KAFKA_SESSION_TIMEOUT", "20s"}},
		{"bad session timeout", with("COORDINATOR_KAFKA_SESSION_TIMEOUT", "banana"), nil, []string{"COORDINATOR_KAFKA_SESSION_TIMEOUT", "banana"}},
		{"bad resume interval", with("COORDINATOR_RESUME_INTERVAL", "0s"), nil, []string{"COORDINATOR_RESUME_INTERVAL", "at least 100ms"}},
		{"bad resume attempts", with("COORDINATOR_RESUME_MAX_ATTEMPTS", "0"), nil, []string{"COORDINATOR_RESUME_MAX_ATTEMPTS"}},
		{"bad republish grace", with("COORDINATOR_EVENTS_REPUBLISH_AFTER", "500ms"), nil, []string{"COORDINATOR_EVENTS_REPUBLISH_AFTER", "at least 1s"}},
		{"republish grace too long", with("COORDINATOR_EVENTS_REPUBLISH_AFTER", "25h"), nil, []string{"COORDINATOR_EVENTS_REPUBLISH_AFTER", "at most 24h"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			code, _, errs := runCLI(t, c.env, append([]string{"serve"}, c.args...)...)
			require.Equal(t, job.ExitUsage, code, errs)
			for _, w := range c.want {
				require.Contains(t, errs, w)
			}
			require.NotContains(t, errs, "CHANGE-ME", "a token is never echoed")
		})
	}
}

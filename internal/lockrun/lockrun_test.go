package lockrun

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
)

func TestLockSecretVariables(t *testing.T) {
	t.Parallel()
	for name, secret := range map[string]bool{
		"COORDINATOR_DATABASE_URL":             true,
		"COORDINATOR_DATABASE_URL_FILE":        true,
		"COORDINATOR_LOCK_REDIS_URL":           true,
		"COORDINATOR_LOCK_REDIS_PASSWORD_FILE": true,
		"COORDINATOR_LOCK_REDIS_TLS_KEY_FILE":  true,
		"COORDINATOR_ADMIN_TOKEN":              true,
		"COORDINATOR_ADMIN_TOKEN_FILE":         true,
		"COORDINATOR_ADMIN_TOKENS_FILE":        true,
		"COORDINATOR_KAFKA_SASL_PASSWORD":      true,
		"COORDINATOR_KAFKA_TLS_KEY_FILE":       true,
		"COORDINATOR_KAFKA_TLS_CA_FILE":        false, // public
		"COORDINATOR_KAFKA_TLS_CERT_FILE":      false,
		"COORDINATOR_LOCK_KEY":                 false,
		"COORDINATOR_LOCK_KEY_PREFIX":          false,
		"COORDINATOR_LOG_LEVEL":                false,
		"DATABASE_URL":                         false, // not ours: the command's own business
		"REDIS_PASSWORD":                       false,
	} {
		require.Equal(t, secret, isSecretVar(name), name)
	}
}

func TestLockGraceFit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		lease    time.Duration // 0: watchdog
		ttl      time.Duration
		grace    time.Duration // 0: not given
		want     time.Duration
		refusing bool
	}{
		{"watchdog default shrinks to what fits", 0, 30 * time.Second, 0, 30*time.Second/3 - 1502*time.Millisecond - 500*time.Millisecond, false},
		{"watchdog long enough for 10s", 0, 40 * time.Second, 0, 10 * time.Second, false},
		{"watchdog given too long", 0, 30 * time.Second, 10 * time.Second, 0, true},
		{"explicit default is half of what fits", 10 * time.Second, 10 * time.Second, 0, (10*time.Second - 502*time.Millisecond - 500*time.Millisecond) / 2, false},
		{"explicit long lease keeps 10s", time.Hour, time.Hour, 0, 10 * time.Second, false},
		{"explicit given fits", 4 * time.Second, 4 * time.Second, time.Second, time.Second, false},
		{"explicit grace leaving no run time", 2 * time.Second, 2 * time.Second, 1698 * time.Millisecond, 0, true},
		{"explicit 2s lease, 5s grace", 2 * time.Second, 2 * time.Second, 5 * time.Second, 0, true},
	} {
		a := Args{Grace: defaultGrace, Lease: c.lease}
		if c.grace > 0 {
			a.Grace, a.GraceSet = c.grace, true
		}
		got, err := fitGrace(a, c.ttl, c.lease == 0)
		if c.refusing {
			require.Error(t, err, c.name)
			continue
		}
		require.NoError(t, err, c.name)
		require.Equal(t, c.want, got, c.name)
	}
}

func TestParseArgs(t *testing.T) {
	t.Parallel()
	a, err := ParseArgs([]string{"--key", "k", "--lease=5s", "--log-level", "warn", "--wait", "0", "--lock-enabled=false", "--", "sh", "-c", "exit 3"})
	require.NoError(t, err)
	require.Equal(t, "k", a.Key)
	require.Equal(t, 5*time.Second, a.Lease)
	require.True(t, a.WaitSet)
	require.Zero(t, a.Wait)
	require.False(t, a.GraceSet)
	require.Equal(t, defaultGrace, a.Grace)
	require.Equal(t, []string{"--log-level", "warn", "--lock-enabled=false"}, a.Config)
	require.Equal(t, []string{"sh", "-c", "exit 3"}, a.Argv)

	for _, bad := range [][]string{
		{"--", "true"},
		{"--key", "k"},
		{"--key", "k", "--"},
		{"--key", "bad key", "--", "true"},
		{"--key", "k", "--lease", "soon", "--", "true"},
		{"--key", "k", "--grace", "-1s", "--", "true"},
		{"--key", "k", "stray", "--", "true"},
	} {
		_, err := ParseArgs(bad)
		require.Error(t, err, "%q", bad)
	}
}

// Run in this process, on the in-memory Locker: the command sees the
// lock's variables, its exit status is Run's, and the lock is released
// when it ends.
func TestRunInProcess(t *testing.T) {
	locker := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "in-process"})
	t.Cleanup(func() { _ = locker.Close() })
	a, err := ParseArgs([]string{"--key", "inproc", "--", "sh", "-c", `echo "$COORDINATOR_LOCK_KEY $COORDINATOR_LOCK_OWNER"; exit 7`})
	require.NoError(t, err)
	var out, errs bytes.Buffer
	code := Run(context.Background(), Config{
		Args: a, WatchdogTimeout: 30 * time.Second,
		Open:   func(context.Context, time.Duration) (ownership.Locker, error) { return unclosable{locker}, nil },
		Stdout: &out, Stderr: &errs,
		Environ: []string{"PATH=" + os.Getenv("PATH")},
	})
	require.Equal(t, 7, code, errs.String())
	require.Equal(t, "inproc in-process\n", out.String())
	le, err := locker.Acquire(context.Background(), "inproc", 0)
	require.NoError(t, err, "released when the command ended")
	require.NoError(t, le.Release(context.Background()))
}

// unclosable keeps Run's Close from closing the test's Locker.
type unclosable struct{ ownership.Locker }

func (unclosable) Close() error { return nil }

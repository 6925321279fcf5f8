package main

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func TestOpenLockerDisabledIsLoudMemoryLocker(t *testing.T) {
	t.Parallel()
	cfg, _, err := config.Load("test", nil, func(k string) string {
		return map[string]string{"COORDINATOR_LOCK_ENABLED": "false", "COORDINATOR_REPLICA_ID": "solo"}[k]
	})
	require.NoError(t, err)
	var logs bytes.Buffer
	l, err := openLocker(context.Background(), cfg, slog.New(slog.NewTextHandler(&logs, nil)), prometheus.NewRegistry())
	require.NoError(t, err)
	defer l.Close()
	require.IsType(t, &ownership.MemoryLocker{}, l)
	require.Equal(t, "solo", l.Owner())
	require.Contains(t, logs.String(), "level=WARN")
	require.Contains(t, logs.String(), "NO exclusion across replicas")
}

func TestOpenLockerRedis(t *testing.T) {
	t.Parallel()
	r := testenv.Redis(t)
	cfg, _, err := config.Load("test", nil, func(k string) string {
		return map[string]string{"COORDINATOR_LOCK_REDIS_URL": r.URL, "COORDINATOR_LOCK_KEY_PREFIX": r.Prefix,
			"COORDINATOR_REPLICA_ID": "r1", "COORDINATOR_LOCK_WATCHDOG_TIMEOUT": "1s"}[k]
	})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	l, err := openLocker(context.Background(), cfg, slog.New(slog.DiscardHandler), reg)
	require.NoError(t, err)
	ctx := context.Background()
	le, err := l.Acquire(ctx, "wiring/k", 0)
	require.NoError(t, err)
	n, err := r.Client.Exists(ctx, r.Prefix+":{wiring/k}:lock").Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the lock lives under the configured prefix")
	pinger, ok := l.(interface{ Ping(context.Context) error })
	require.True(t, ok, "readiness needs Ping")
	require.NoError(t, pinger.Ping(ctx))
	_, ok = l.(ownership.Inspector)
	require.True(t, ok)
	require.NoError(t, le.Release(ctx))
	require.NoError(t, l.Close())
	require.NoError(t, l.Close(), "Close twice")
	// The client is closed with the Locker.
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	require.Error(t, pinger.Ping(pctx))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	require.NotEmpty(t, mfs, "metrics registered")
}

// A Redis that may evict lock keys is refused at start, naming the setting.
func TestOpenLockerRefusesAnEvictingRedis(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServerWith(t, testenv.RedisServerOptions{Args: []string{"--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"}})
	cfg, _, err := config.Load("test", nil, func(k string) string {
		return map[string]string{"COORDINATOR_LOCK_REDIS_URL": srv.URL(), "COORDINATOR_REPLICA_ID": "r1"}[k]
	})
	require.NoError(t, err)
	_, err = openLocker(context.Background(), cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	require.ErrorContains(t, err, "COORDINATOR_LOCK_REDIS_URL")
	require.ErrorContains(t, err, "maxmemory-policy volatile-lru")
	require.ErrorContains(t, err, "noeviction")
}

// A Redis that may evict lock keys is a configuration error for every
// command that opens the lock: exit 64 naming COORDINATOR_LOCK_REDIS_URL,
// not 69 (a wrapper that retries on 69 would retry for ever). Nothing runs.
func TestAnEvictingLockRedisIsExit64Everywhere(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServerWith(t, testenv.RedisServerOptions{Args: []string{"--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"}})
	pg := testenv.Postgres(t)
	env := map[string]string{
		"COORDINATOR_LOCK_REDIS_URL": srv.URL(), "COORDINATOR_DATABASE_URL": pg.DSN, "COORDINATOR_REPLICA_ID": "evict",
		"COORDINATOR_HTTP_ADDR": "127.0.0.1:0", "COORDINATOR_KAFKA_BROKERS": "127.0.0.1:1", "COORDINATOR_LOG_LEVEL": "error",
	}
	marker := filepath.Join(t.TempDir(), "ran")
	for _, args := range [][]string{
		{"lock", "--key", "evict", "--", "touch", marker},
		{"locks"},
		{"run", "reaper"},
		{"serve"},
	} {
		code, _, errs := runCLI(t, env, args...)
		require.Equal(t, job.ExitUsage, code, "%q: %s", args, errs)
		require.Contains(t, errs, "COORDINATOR_LOCK_REDIS_URL", "%q", args)
		require.Contains(t, errs, "allkeys-lru", "%q", args)
	}
	require.NoFileExists(t, marker)
}

// lockerWith opens the production Locker on env (plus the test's prefix) and
// returns it with the error of one acquire-release round trip.
func lockerWith(t *testing.T, env map[string]string) (ownership.Locker, error) {
	t.Helper()
	env["COORDINATOR_LOCK_WAIT_TIME"] = "2s"
	cfg, _, err := config.Load("test", nil, func(k string) string { return env[k] })
	require.NoError(t, err)
	l, err := openLocker(context.Background(), cfg, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	le, err := l.Acquire(ctx, "wiring/tls", 0)
	if err == nil {
		err = le.Release(ctx)
	}
	return l, err
}

func TestOpenLockerOverTLS(t *testing.T) {
	t.Parallel()
	sr := testenv.RedisTLS(t)
	prefix := testenv.Redis(t).Prefix // the same server: its cleanup covers the TLS port's keys
	base := func() map[string]string {
		return map[string]string{"COORDINATOR_LOCK_REDIS_URL": sr.URL, "COORDINATOR_LOCK_KEY_PREFIX": prefix,
			"COORDINATOR_LOCK_REDIS_TLS_CA_FILE": sr.CAFile}
	}
	_, err := lockerWith(t, base())
	require.NoError(t, err, "rediss:// verified with COORDINATOR_LOCK_REDIS_TLS_CA_FILE")

	env := base()
	delete(env, "COORDINATOR_LOCK_REDIS_TLS_CA_FILE")
	_, err = lockerWith(t, env)
	require.ErrorIs(t, err, ownership.ErrUnavailable, "the system roots do not know the test CA: fail closed")
	require.ErrorContains(t, err, "certificate")

	// The server verifies a client certificate it is shown against the test
	// CA: another CA's is refused, so the pass with the test client's proves
	// the configured certificate is sent.
	foreignCA, foreignCert, foreignKey := testenv.ForeignTLS(t)
	env = base()
	env["COORDINATOR_LOCK_REDIS_TLS_CERT_FILE"], env["COORDINATOR_LOCK_REDIS_TLS_KEY_FILE"] = foreignCert, foreignKey
	_, err = lockerWith(t, env)
	require.ErrorIs(t, err, ownership.ErrUnavailable)
	env["COORDINATOR_LOCK_REDIS_TLS_CERT_FILE"], env["COORDINATOR_LOCK_REDIS_TLS_KEY_FILE"] = sr.ClientCertFile, sr.ClientKeyFile
	_, err = lockerWith(t, env)
	require.NoError(t, err)

	env = base()
	env["COORDINATOR_LOCK_REDIS_TLS_CA_FILE"] = foreignCA
	_, err = lockerWith(t, env)
	require.ErrorIs(t, err, ownership.ErrUnavailable, "a CA that did not sign the server's certificate")
}

func TestOpenLockerPasswordFile(t *testing.T) {
	t.Parallel()
	r := testenv.Redis(t)
	ctx := context.Background()
	user, password := testenv.UniqueName("u"), testenv.UniqueName("Hunter2")
	require.NoError(t, r.Client.Do(ctx, "ACL", "SETUSER", user, "on", ">"+password, "~"+r.Prefix+":*", "&"+r.Prefix+":*", "+@all").Err())
	t.Cleanup(func() { r.Client.Do(context.Background(), "ACL", "DELUSER", user) })
	addr := strings.TrimPrefix(strings.TrimSuffix(r.URL, "/0"), "redis://")
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good"), filepath.Join(dir, "bad")
	require.NoError(t, os.WriteFile(good, []byte(password+"\n"), 0o600))
	require.NoError(t, os.WriteFile(bad, []byte("wrong-"+password), 0o600))
	env := func(file string) map[string]string {
		return map[string]string{"COORDINATOR_LOCK_REDIS_URL": "redis://" + user + "@" + addr + "/0",
			"COORDINATOR_LOCK_KEY_PREFIX": r.Prefix, "COORDINATOR_LOCK_REDIS_PASSWORD_FILE": file}
	}
	_, err := lockerWith(t, env(good))
	require.NoError(t, err, "the password from the file, its final newline dropped")
	_, err = lockerWith(t, env(bad))
	require.ErrorIs(t, err, ownership.ErrUnavailable)
	require.NotContains(t, err.Error(), password)

	// The password in one place only.
	bothEnv := env(good)
	bothEnv["COORDINATOR_LOCK_REDIS_URL"] = "redis://" + user + ":" + password + "@" + addr + "/0"
	err = loadLock(bothEnv)
	require.ErrorContains(t, err, "COORDINATOR_LOCK_REDIS_PASSWORD_FILE")
	require.NotContains(t, err.Error(), password)
}

// loadLock loads the configuration as every command does: the settings,
// then the lock's, which go-redis parses.
func loadLock(env map[string]string) error {
	cfg, _, err := config.Load("serve", nil, func(k string) string { return env[k] })
	if err != nil {
		return err
	}
	return checkLockSettings(cfg)
}

func TestLockURLsInGoRedisFormats(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, mode string }{
		{"redis://127.0.0.1:6379/0", "single"},
		{"rediss://coordinator@cache.internal:6380/2?dial_timeout=2s", "single"},
		{"redis://s1:26379/0?master_name=locks&addr=s2:26379&addr=s3:26379", "sentinel"},
		{"redis://n1:7000?addr=n2:7000&addr=n3:7000", "cluster"},
	} {
		require.NoError(t, loadLock(map[string]string{"COORDINATOR_LOCK_REDIS_URL": tc.url, "COORDINATOR_LOCK_REDIS_MODE": tc.mode}), tc.url)
	}
	// The old private format's comma list is refused with a pointer to the new one.
	err := loadLock(map[string]string{"COORDINATOR_LOCK_REDIS_URL": "redis://:pw@a:1,b:2/0?master_name=m", "COORDINATOR_LOCK_REDIS_MODE": "sentinel"})
	require.ErrorContains(t, err, "?addr=")
	var cerr *config.Error
	require.ErrorAs(t, err, &cerr)
	require.Equal(t, "COORDINATOR_LOCK_REDIS_URL", cerr.Variable)
	// A password in the URL and in COORDINATOR_LOCK_REDIS_PASSWORD_FILE.
	pw := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(pw, []byte("secret\n"), 0o600))
	err = loadLock(map[string]string{"COORDINATOR_LOCK_REDIS_URL": "redis://:other@r:6379/0", "COORDINATOR_LOCK_REDIS_PASSWORD_FILE": pw})
	require.ErrorContains(t, err, "keep the password in one place")
	require.NotContains(t, err.Error(), "other")
}

// The shapes of a Redis secret that used to be echoed: a password holding a
// '%', a sentinel password, an unknown option's value.
func TestLockURLSecretsNeverEchoed(t *testing.T) {
	t.Parallel()
	for _, e := range []map[string]string{
		{"COORDINATOR_LOCK_REDIS_URL": "redis://:Hunter2%zz@r:6379/0"},
		{"COORDINATOR_LOCK_REDIS_URL": "redis://s:6379/0?master_name=m&password=Hunter2&bogus=1", "COORDINATOR_LOCK_REDIS_MODE": "sentinel"},
		{"COORDINATOR_LOCK_REDIS_URL": "redis://:s3nt@s:6379/0?master_name=m&frobnicate=Hunter2", "COORDINATOR_LOCK_REDIS_MODE": "sentinel"},
		{"COORDINATOR_LOCK_REDIS_URL": "redis://r:6379/0?dial_timeout=Hunter2"},
	} {
		err := loadLock(e)
		require.Error(t, err, "%v", e)
		require.NotContains(t, err.Error(), "Hunter2", "%v", e)
		require.NotContains(t, err.Error(), "s3nt", "%v", e)
	}
}

// FuzzLockURLSecretsNeverEchoed: whatever the Redis URL's secrets hold, the
// error that refuses it never shows them.
func FuzzLockURLSecretsNeverEchoed(f *testing.F) {
	for _, s := range []string{"hunter2", "p%zz", "a#b", "a@b/c?d", "", "%", ",x:1", "&password=x", "\n"} {
		f.Add(s, uint8(0))
	}
	f.Fuzz(func(t *testing.T, fuzz string, which uint8) {
		secret := "S3CR" + fuzz + "T0P"
		settings := []map[string]string{
			{"COORDINATOR_LOCK_REDIS_URL": "redis://:" + secret + "@r:6379/0"},
			{"COORDINATOR_LOCK_REDIS_URL": "rediss://u:" + secret + "@r:6380/0?" + fuzz, "COORDINATOR_LOCK_REDIS_MODE": "cluster"},
			{"COORDINATOR_LOCK_REDIS_URL": "redis://s:" + secret + "@s:26379/0?master_name=m&password=" + secret + "&" + fuzz, "COORDINATOR_LOCK_REDIS_MODE": "sentinel"},
			{"COORDINATOR_LOCK_REDIS_URL": "redis://r:6379/0?opt_" + fuzz + "=" + secret},
		}
		e := settings[int(which)%len(settings)]
		if err := loadLock(e); err != nil && (strings.Contains(err.Error(), "S3CR") || strings.Contains(err.Error(), "T0P")) {
			t.Fatalf("%v: error shows the secret: %v", e, err)
		}
	})
}

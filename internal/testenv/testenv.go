// Package testenv hands tests real dependencies: a migrated PostgreSQL schema
// of their own, a Redis key prefix of their own, and unique Kafka topic names.
//
// Where they come from, in order:
//  1. the environment: COORDINATOR_TEST_DATABASE_URL, COORDINATOR_TEST_REDIS_URL,
//     COORDINATOR_TEST_REDIS_CLUSTER_ADDRS, COORDINATOR_TEST_REDIS_SENTINEL_ADDRS
//     (with COORDINATOR_TEST_REDIS_SENTINEL_MASTER), COORDINATOR_TEST_KAFKA_BROKERS
//     (`eval "$(scripts/services env)"` after `scripts/services up`);
//  2. testcontainers-go, when a Docker engine answers (for Sentinel: a
//     private master, replica and Sentinel started from the local
//     redis-server, see StartRedisSentinelSet);
//  3. otherwise the test fails, saying how to provide one. A real dependency
//     is never skipped silently.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/telco-platform/coordinator/internal/migrate"
	"github.com/telco-platform/coordinator/internal/postgres"
)

// Variables read by this package.
const (
	EnvDatabaseURL       = "COORDINATOR_TEST_DATABASE_URL"
	EnvRedisURL          = "COORDINATOR_TEST_REDIS_URL"
	EnvRedisClusterAddrs = "COORDINATOR_TEST_REDIS_CLUSTER_ADDRS"
	EnvRedisSentinels    = "COORDINATOR_TEST_REDIS_SENTINEL_ADDRS"
	EnvRedisSentinelName = "COORDINATOR_TEST_REDIS_SENTINEL_MASTER"
	EnvKafkaBrokers      = "COORDINATOR_TEST_KAFKA_BROKERS"
	EnvRedisServerBin    = "COORDINATOR_TEST_REDIS_SERVER_BIN"
	EnvPGBinDir          = "COORDINATOR_TEST_PG_BIN_DIR"
)

const howTo = "run `make services-up` and `eval \"$(scripts/services env)\"` (or `make test`, which does both), or start a Docker engine for testcontainers"

// UniqueName returns prefix_ plus 12 random hex characters, lower case, safe
// as a Postgres schema, a Redis key prefix or a Kafka topic suffix.
func UniqueName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

func unavailable(t testing.TB, what, env string, err error) {
	t.Helper()
	msg := fmt.Sprintf("testenv: no %s: set %s or %s", what, env, howTo)
	if err != nil {
		msg += fmt.Sprintf(" (docker: %v)", err)
	}
	t.Fatal(msg)
}

// PG is a migrated schema of the test's own.
type PG struct {
	// DSN points at the schema (search_path is set), for pools the code
	// under test opens itself and for child processes.
	DSN    string
	Pool   *pgxpool.Pool
	Schema string
	// AdminDSN points at the same database without the search_path.
	AdminDSN string
}

// Postgres returns a fresh schema with every migration applied. The schema is
// dropped when the test ends.
func Postgres(t testing.TB) *PG {
	t.Helper()
	return postgresSchema(t, true)
}

// PostgresEmpty returns a fresh schema with no migration applied (migration tests).
func PostgresEmpty(t testing.TB) *PG {
	t.Helper()
	return postgresSchema(t, false)
}

func postgresSchema(t testing.TB, migrated bool) *PG {
	t.Helper()
	base := os.Getenv(EnvDatabaseURL)
	if base == "" {
		var err error
		if base, err = containerPostgres(); err != nil {
			unavailable(t, "PostgreSQL", EnvDatabaseURL, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	admin, err := postgres.Connect(ctx, base, 2)
	if err != nil {
		t.Fatalf("testenv: %s: %v", EnvDatabaseURL, err)
	}
	defer admin.Close()
	// The test database is disposable by definition: mark it, so that seed
	// and migrate down run on it without --force (scripts/services marks
	// its databases too).
	if err := postgres.MarkDisposable(ctx, admin, "testenv"); err != nil {
		t.Fatalf("testenv: %s: %v", EnvDatabaseURL, err)
	}
	schema := UniqueName("t")
	if _, err := admin.Exec(ctx, "create schema "+schema); err != nil {
		t.Fatalf("testenv: create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		a, err := postgres.Connect(ctx, base, 1)
		if err != nil {
			t.Logf("testenv: drop schema %s: %v", schema, err)
			return
		}
		defer a.Close()
		if _, err := a.Exec(ctx, "drop schema "+schema+" cascade"); err != nil {
			t.Logf("testenv: drop schema %s: %v", schema, err)
		}
	})

	dsn, err := WithSearchPath(base, schema)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	pool, err := postgres.Connect(ctx, dsn, 16)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(pool.Close)
	if migrated {
		// A migration lock of the schema's own: with goose's (one per
		// database) every test migrating at the same time would wait 5s.
		m, err := migrate.New(pool, migrate.WithLockID(lockID(schema)))
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		defer m.Close()
		if _, err := m.Up(ctx); err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}
	return &PG{DSN: dsn, Pool: pool, Schema: schema, AdminDSN: base}
}

// lockID is an advisory lock id derived from a schema name.
func lockID(schema string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("coordinator-migrate:" + schema))
	return int64(h.Sum64())
}

// WithSearchPath returns dsn with search_path set to schema.
func WithSearchPath(dsn, schema string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("%s must be a postgres:// URL", EnvDatabaseURL)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// RedisEnv is a Redis of the test's own key prefix.
type RedisEnv struct {
	URL    string
	Client *redis.Client
	// Prefix is unique per test: pass it as the Locker's key prefix.
	Prefix string
}

// Redis returns a client on the test Redis and a fresh key prefix; keys under
// the prefix are deleted when the test ends.
func Redis(t testing.TB) *RedisEnv {
	t.Helper()
	raw := os.Getenv(EnvRedisURL)
	if raw == "" {
		var err error
		if raw, err = containerRedis(); err != nil {
			unavailable(t, "Redis", EnvRedisURL, err)
		}
	}
	opt, err := redis.ParseURL(raw)
	if err != nil {
		t.Fatalf("testenv: %s: %v", EnvRedisURL, err)
	}
	c := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("testenv: Redis at %s: %v (%s)", opt.Addr, err, howTo)
	}
	prefix := UniqueName("t")
	t.Cleanup(func() {
		deletePrefix(c, prefix)
		_ = c.Close()
	})
	return &RedisEnv{URL: raw, Client: c, Prefix: prefix}
}

// deletePrefix deletes every key under prefix (a test's own), bounded.
func deletePrefix(c *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		c.Del(ctx, iter.Val())
	}
}

// RedisClusterAddrs returns the seed addresses of the shared Redis Cluster
// (scripts/services: 3 masters with a replica each; every node is a seed).
// There is no container fallback: the services script starts one. A test
// that migrates slots or stops nodes starts a cluster of its own
// (StartRedisCluster).
func RedisClusterAddrs(t testing.TB) []string {
	t.Helper()
	raw := os.Getenv(EnvRedisClusterAddrs)
	if raw == "" {
		unavailable(t, "Redis Cluster", EnvRedisClusterAddrs, nil)
	}
	return strings.Split(raw, ",")
}

// RedisSentinelEnv is a Sentinel-watched master (and replica) and a key
// prefix of the test's own.
type RedisSentinelEnv struct {
	// URL is the lock URL in sentinel mode (go-redis' ParseFailoverURL):
	// redis://s1/0?master_name=NAME[&addr=s2...].
	URL string
	// Client talks to the current master through Sentinel.
	Client *redis.Client
	Prefix string
}

// RedisSentinel returns the test Sentinel set of COORDINATOR_TEST_REDIS_SENTINEL_ADDRS
// and COORDINATOR_TEST_REDIS_SENTINEL_MASTER, else a private one
// (StartRedisSentinelSet), and a fresh key prefix whose keys are deleted
// when the test ends. Tests that kill servers use StartRedisSentinelSet.
func RedisSentinel(t testing.TB) *RedisSentinelEnv {
	t.Helper()
	addrs, name := os.Getenv(EnvRedisSentinels), os.Getenv(EnvRedisSentinelName)
	if addrs == "" || name == "" {
		set := StartRedisSentinelSet(t)
		addrs, name = set.Sentinel.Addr(), set.MasterName
	}
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: name, SentinelAddrs: strings.Split(addrs, ",")})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("testenv: Redis master %q via Sentinel %s: %v (%s)", name, addrs, err, howTo)
	}
	prefix := UniqueName("t")
	t.Cleanup(func() {
		deletePrefix(c, prefix)
		_ = c.Close()
	})
	list := strings.Split(addrs, ",")
	u := "redis://" + list[0] + "/0?master_name=" + name
	for _, a := range list[1:] {
		u += "&addr=" + a
	}
	return &RedisSentinelEnv{URL: u, Client: c, Prefix: prefix}
}

// KafkaEnv is a real Kafka broker and a namespace of topic names.
type KafkaEnv struct {
	Brokers []string
	// Suffix is unique per test: Topic appends it.
	Suffix string
}

// Topic returns name made unique to this test.
func (k *KafkaEnv) Topic(name string) string { return name + "." + k.Suffix }

// Kafka returns the test broker's addresses and a fresh topic namespace.
func Kafka(t testing.TB) *KafkaEnv {
	t.Helper()
	raw := os.Getenv(EnvKafkaBrokers)
	if raw == "" {
		var err error
		if raw, err = containerKafka(); err != nil {
			unavailable(t, "Kafka", EnvKafkaBrokers, err)
		}
	}
	return &KafkaEnv{Brokers: strings.Split(raw, ","), Suffix: UniqueName("t")}
}

// Binary returns the path of an external program the test needs (a
// redis-server or Postgres binary to start and kill), from the environment or
// the Debian locations; it fails the test when none exists.
func Binary(t testing.TB, env, fallback string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		p = fallback
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("testenv: %s not found (%v): install it (scripts/services up does) or set %s", p, err, env)
	}
	return p
}

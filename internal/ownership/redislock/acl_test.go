package redislock_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/ownershiptest"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// The minimal ACL of docs/security.md, tested. The one list to update when
// the lock starts using a command is that rule in docs/security.md: the
// commands the scripts call are found in this package's source, and the
// client-side ones are clientCommands below; TestACLRuleCoversTheLock fails,
// naming the command, when either is missing from the documented rule.

// clientCommands are the commands this package sends outside the scripts.
var clientCommands = []string{
	"hello", "ping", // connection handshake, readiness
	"evalsha", "eval", // the scripts (EVAL after NOSCRIPT)
	"subscribe", "unsubscribe", // each Locker's wake channel
	"scan", "hmget", "pttl", // Locks (coordinator locks, GET /v1/locks)
	"hgetall",                    // Locks in the redisson layout
	"ssubscribe", "sunsubscribe", // Redisson's sharded unlock channel (redisson layout, cluster)
	"info", "wait", // eviction policy and replicas at start; WAIT after acquire and renew
}

// scriptCommands returns the commands the package's Lua scripts call
// (redis.call / redis.pcall), read from its non-test source files.
func scriptCommands(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	re := regexp.MustCompile(`redis\.p?call\(\s*['"]([A-Za-z|]+)['"]`)
	seen := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range re.FindAllSubmatch(b, -1) {
			seen[strings.ToLower(string(m[1]))] = true
		}
	}
	require.NotEmpty(t, seen, "no redis.call found: has the scripts' source moved?")
	out := make([]string, 0, len(seen))
	for c := range seen {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// documentedACL returns the ACL SETUSER rule of docs/security.md.
func documentedACL(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "security.md"))
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)<!-- redis-acl:begin -->\\s*```\\s*(ACL SETUSER [^\\n]+)\\s*```\\s*<!-- redis-acl:end -->").FindSubmatch(b)
	require.NotNil(t, m, "docs/security.md: no ACL SETUSER rule between the redis-acl markers")
	return string(m[1])
}

func TestACLRuleCoversTheLock(t *testing.T) {
	t.Parallel()
	rule := strings.Fields(documentedACL(t))
	for _, c := range append(scriptCommands(t), clientCommands...) {
		require.Containsf(t, rule, "+"+c, "docs/security.md's ACL does not allow %q, which the lock uses", c)
	}
}

// aclUser creates the documented user for prefix on the test Redis (the
// rule with the user name, password and prefix replaced) and removes it
// when the test ends. It returns the user's URL.
func aclUser(t *testing.T, env *testenv.RedisEnv) string {
	t.Helper()
	user := testenv.UniqueName("acl")
	password := testenv.UniqueName("pw")
	rule := documentedACL(t)
	rule = strings.ReplaceAll(rule, "coordinator:", env.Prefix+":")
	rule = strings.Replace(rule, "ACL SETUSER coordinator ", "ACL SETUSER "+user+" ", 1)
	rule = strings.Replace(rule, ">PASSWORD", ">"+password, 1)
	args := []any{}
	for _, f := range strings.Fields(rule) {
		args = append(args, f)
	}
	ctx := context.Background()
	require.NoError(t, env.Client.Do(ctx, args...).Err(), "%s", rule)
	t.Cleanup(func() { env.Client.Do(context.Background(), "ACL", "DELUSER", user) })
	opt, err := redis.ParseURL(env.URL)
	require.NoError(t, err)
	return fmt.Sprintf("redis://%s:%s@%s/%d", user, password, opt.Addr, opt.DB)
}

func TestConformanceUnderTheMinimalACL(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	url := aclUser(t, env)
	ownershiptest.Run(t, backend(url, redislock.ModeSingle, env.Prefix, env.Client))

	// Locks (coordinator locks) works under it too.
	l := newLocker(t, url, redislock.ModeSingle, env.Prefix, ownershiptest.Options{Owner: "acl", WaitTime: time.Second, WatchdogTimeout: time.Second})
	ctx := context.Background()
	lease, err := l.Acquire(ctx, "acl/inspect", 0)
	require.NoError(t, err)
	infos, err := l.Locks(ctx)
	require.NoError(t, err)
	require.True(t, slices.ContainsFunc(infos, func(i ownership.LockInfo) bool { return i.Key == "acl/inspect" && i.Owner == "acl" }), "%v", infos)
	// So does LockTTL (coordinator lock's check of its lock).
	ttl, held, err := l.LockTTL(ctx, "acl/inspect", lease.Fence())
	require.NoError(t, err)
	require.True(t, held)
	require.Positive(t, ttl)
	_, held, err = l.LockTTL(ctx, "acl/inspect", lease.Fence()+1)
	require.NoError(t, err)
	require.False(t, held, "another term's lock is not held")
	require.NoError(t, lease.Release(ctx))
	_, held, err = l.LockTTL(ctx, "acl/inspect", lease.Fence())
	require.NoError(t, err)
	require.False(t, held, "a released lock is not held")
}

func TestTheMinimalACLRefusesTheRest(t *testing.T) {
	t.Parallel()
	env := testenv.Redis(t)
	url := aclUser(t, env)
	opt, err := redis.ParseURL(url)
	require.NoError(t, err)
	c := redis.NewClient(opt)
	defer c.Close()
	ctx := context.Background()
	require.NoError(t, c.Ping(ctx).Err(), "the user can log in")
	for _, cmd := range [][]any{
		{"FLUSHALL"},
		{"CONFIG", "GET", "requirepass"},
		{"KEYS", "*"},
		{"LPUSH", env.Prefix + ":{k}:lock", "x"},       // a command the lock does not use, on its own key
		{"HSET", "otherapp:{k}:lock", "owner", "x"},    // a command it uses, on a key outside the prefix
		{"PUBLISH", "otherapp:wake:x", "x"},            // a channel outside the pattern
		{"EVAL", "return redis.call('flushall')", "0"}, // a script is held to the same rule
	} {
		err := c.Do(ctx, cmd...).Err()
		require.Errorf(t, err, "%v should be refused", cmd)
		// NOPERM; a script's refused call is "ERR The user executing the script can't run this command".
		require.Truef(t, strings.Contains(err.Error(), "NOPERM") || strings.Contains(err.Error(), "can't run this command"), "%v: %v", cmd, err)
	}
}

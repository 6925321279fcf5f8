package redislock

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Client defaults: an unreachable Redis fails an Acquire in about a second
// (fail closed well inside the default 5s wait budget), and the pool is
// large enough for many concurrent lock calls.
const (
	DefaultDialTimeout  = time.Second
	DefaultReadTimeout  = 2 * time.Second
	DefaultWriteTimeout = 2 * time.Second
	DefaultPoolTimeout  = 2 * time.Second
	DefaultMaxRetries   = 1
)

// Modes of NewClient.
const (
	ModeSingle   = "single"
	ModeSentinel = "sentinel"
	ModeCluster  = "cluster"
)

// NewClient builds the go-redis client for a lock backend URL (the formats of
// internal/config):
//
//	single:   redis[s]://[[user]:password@]host:port[/db][?opts]
//	sentinel: redis[s]://[[user]:password@]host:port[,host:port...][/db]?master_name=NAME[&opts]
//	cluster:  redis[s]://[[user]:password@]host:port[,host:port...][?opts]
//
// opts are dial_timeout, read_timeout, write_timeout (Go durations),
// pool_size, max_retries (integers) and, for sentinel, sentinel_username and
// sentinel_password. Unknown options are an error. Nothing is contacted.
func NewClient(rawURL, mode string) (redis.UniversalClient, error) {
	opts, err := ParseOptions(rawURL, mode)
	if err != nil {
		return nil, err
	}
	return redis.NewUniversalClient(opts), nil
}

// ParseOptions is NewClient without building the client.
func ParseOptions(rawURL, mode string) (*redis.UniversalOptions, error) {
	fail := func(format string, args ...any) (*redis.UniversalOptions, error) {
		return nil, fmt.Errorf("redislock: %s URL %s: %s", mode, redactURL(rawURL), fmt.Sprintf(format, args...))
	}
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok || (scheme != "redis" && scheme != "rediss") {
		return fail("scheme must be redis:// or rediss://")
	}
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	var user *url.Userinfo
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		u, err := url.Parse("redis://" + authority[:i+1] + "h")
		if err != nil {
			return fail("bad user info")
		}
		user, authority = u.User, authority[i+1:]
	}
	var addrs []string
	for _, a := range strings.Split(authority, ",") {
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" {
			return fail("address %q is not host:port", a)
		}
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return fail("address %q has a bad port", a)
		}
		addrs = append(addrs, a)
	}
	rest2, err := url.Parse("redis://h" + tail)
	if err != nil {
		return fail("bad path or query")
	}
	opts := &redis.UniversalOptions{
		Addrs:                    addrs,
		DialTimeout:              DefaultDialTimeout,
		ReadTimeout:              DefaultReadTimeout,
		WriteTimeout:             DefaultWriteTimeout,
		PoolTimeout:              DefaultPoolTimeout,
		ContextTimeoutEnabled:    true,
		MaxRetries:               DefaultMaxRetries,
		DialerRetries:            1,
		DialerRetryTimeout:       50 * time.Millisecond,
		PoolSize:                 max(32, 10*runtime.GOMAXPROCS(0)),
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	if user != nil {
		opts.Username = user.Username()
		opts.Password, _ = user.Password()
	}
	if p := strings.Trim(rest2.Path, "/"); p != "" {
		db, err := strconv.Atoi(p)
		if err != nil || db < 0 {
			return fail("database %q is not a number", p)
		}
		opts.DB = db
	}
	for k, vs := range rest2.Query() {
		v := vs[len(vs)-1]
		var err error
		switch k {
		case "dial_timeout":
			opts.DialTimeout, err = time.ParseDuration(v)
		case "read_timeout":
			opts.ReadTimeout, err = time.ParseDuration(v)
		case "write_timeout":
			opts.WriteTimeout, err = time.ParseDuration(v)
		case "pool_size":
			opts.PoolSize, err = strconv.Atoi(v)
		case "max_retries":
			opts.MaxRetries, err = strconv.Atoi(v)
		case "master_name":
			opts.MasterName = v
		case "sentinel_username":
			opts.SentinelUsername = v
		case "sentinel_password":
			opts.SentinelPassword = v
		default:
			err = errors.New("unknown option")
		}
		if err != nil {
			return fail("option %s=%q: %v", k, v, err)
		}
	}
	if scheme == "rediss" {
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		if mode == ModeSingle {
			opts.TLSConfig.ServerName, _, _ = net.SplitHostPort(addrs[0])
		}
	}
	switch mode {
	case ModeSingle:
		if len(addrs) != 1 {
			return fail("single mode takes one host:port, got %d", len(addrs))
		}
		if opts.MasterName != "" {
			return fail("master_name needs mode sentinel")
		}
	case ModeSentinel:
		if opts.MasterName == "" {
			return fail("sentinel mode needs ?master_name=NAME")
		}
	case ModeCluster:
		if opts.DB != 0 {
			return fail("cluster mode has only database 0")
		}
		if opts.MasterName != "" {
			return fail("master_name needs mode sentinel")
		}
		opts.IsClusterMode = true
	default:
		return nil, fmt.Errorf("redislock: mode %q: must be single, sentinel or cluster", mode)
	}
	return opts, nil
}

func redactURL(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return "(unparsable)"
	}
	authority := rest
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority = rest[:i]
	}
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		return scheme + "://REDACTED@" + rest[i+1:]
	}
	return raw
}

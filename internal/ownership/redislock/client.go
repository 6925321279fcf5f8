package redislock

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/telco-platform/coordinator/internal/redact"
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

// Locker defaults (COORDINATOR_LOCK_KEY_PREFIX,
// COORDINATOR_LOCK_REDIS_WAIT_TIMEOUT).
const (
	DefaultPrefix         = "coordinator"
	DefaultReplicaTimeout = 200 * time.Millisecond
)

// Modes of NewClient.
const (
	ModeSingle   = "single"
	ModeSentinel = "sentinel"
	ModeCluster  = "cluster"
)

// NewClient builds the go-redis client for a lock backend URL in go-redis'
// own formats, chosen by mode:
//
//	single:   redis.ParseURL          redis[s]://[[user]:password@]host:port[/db][?opts]
//	sentinel: redis.ParseFailoverURL  redis[s]://[[user]:password@]sentinel:port[/db]?master_name=NAME[&addr=sentinel2:port...][&password=MASTER_PASSWORD][&opts]
//	cluster:  redis.ParseClusterURL   redis[s]://[[user]:password@]host:port[?addr=host2:port...][&opts]
//
// (In a sentinel URL the user info is the sentinels' credentials; the data
// nodes' password is the password option.) opts are go-redis' snake_case
// option names (dial_timeout, read_timeout, pool_size, max_retries, ...);
// unknown options are an error. Options that would route lock commands away
// from the master (read_only, route_by_latency, route_randomly,
// replica_only) are refused. Errors show the URL with its secrets redacted
// and never an option's value. Nothing is contacted.
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
		return nil, fmt.Errorf("redislock: %s URL %s: %s", mode, redact.URL(rawURL), fmt.Sprintf(format, args...))
	}
	if !strings.HasPrefix(rawURL, "redis://") && !strings.HasPrefix(rawURL, "rediss://") {
		return fail("scheme must be redis:// or rediss://")
	}
	var o *redis.UniversalOptions
	switch mode {
	case ModeSingle:
		p, err := redis.ParseURL(rawURL)
		if err != nil {
			return fail("%s", parseError(err))
		}
		o = &redis.UniversalOptions{
			Addrs: []string{p.Addr}, ClientName: p.ClientName, DB: p.DB, Protocol: p.Protocol,
			Username: p.Username, Password: p.Password, TLSConfig: p.TLSConfig,
			MaxRetries: p.MaxRetries, MinRetryBackoff: p.MinRetryBackoff, MaxRetryBackoff: p.MaxRetryBackoff,
			DialTimeout: p.DialTimeout, ReadTimeout: p.ReadTimeout, WriteTimeout: p.WriteTimeout,
			PoolFIFO: p.PoolFIFO, PoolSize: p.PoolSize, PoolTimeout: p.PoolTimeout, MaxConcurrentDials: p.MaxConcurrentDials,
			MinIdleConns: p.MinIdleConns, MaxIdleConns: p.MaxIdleConns, MaxActiveConns: p.MaxActiveConns,
			ConnMaxIdleTime: p.ConnMaxIdleTime, ConnMaxLifetime: p.ConnMaxLifetime, ConnMaxLifetimeJitter: p.ConnMaxLifetimeJitter,
			PipelinePoolSize: p.PipelinePoolSize, PipelineReadBufferSize: p.PipelineReadBufferSize, PipelineWriteBufferSize: p.PipelineWriteBufferSize,
		}
	case ModeSentinel:
		p, err := redis.ParseFailoverURL(rawURL)
		if err != nil {
			return fail("%s", parseError(err))
		}
		if p.MasterName == "" {
			return fail("sentinel mode needs ?master_name=NAME")
		}
		if p.RouteByLatency || p.RouteRandomly || p.ReplicaOnly || p.UseDisconnectedReplicas {
			return fail("route_by_latency, route_randomly, replica_only and use_disconnected_replicas send lock commands away from the master")
		}
		o = &redis.UniversalOptions{
			Addrs: p.SentinelAddrs, MasterName: p.MasterName, SentinelUsername: p.SentinelUsername, SentinelPassword: p.SentinelPassword,
			ClientName: p.ClientName, DB: p.DB, Protocol: p.Protocol,
			Username: p.Username, Password: p.Password, TLSConfig: p.TLSConfig,
			MaxRetries: p.MaxRetries, MinRetryBackoff: p.MinRetryBackoff, MaxRetryBackoff: p.MaxRetryBackoff,
			DialTimeout: p.DialTimeout, DialerRetries: p.DialerRetries, DialerRetryTimeout: p.DialerRetryTimeout,
			ReadTimeout: p.ReadTimeout, WriteTimeout: p.WriteTimeout,
			PoolFIFO: p.PoolFIFO, PoolSize: p.PoolSize, PoolTimeout: p.PoolTimeout, MaxConcurrentDials: p.MaxConcurrentDials,
			MinIdleConns: p.MinIdleConns, MaxIdleConns: p.MaxIdleConns, MaxActiveConns: p.MaxActiveConns,
			ConnMaxIdleTime: p.ConnMaxIdleTime, ConnMaxLifetime: p.ConnMaxLifetime, ConnMaxLifetimeJitter: p.ConnMaxLifetimeJitter,
			PipelinePoolSize: p.PipelinePoolSize, PipelineReadBufferSize: p.PipelineReadBufferSize, PipelineWriteBufferSize: p.PipelineWriteBufferSize,
			IdentitySuffix: p.IdentitySuffix,
		}
	case ModeCluster:
		p, err := redis.ParseClusterURL(rawURL)
		if err != nil {
			return fail("%s", parseError(err))
		}
		if p.ReadOnly || p.RouteByLatency || p.RouteRandomly {
			return fail("read_only, route_by_latency and route_randomly send lock commands away from the masters")
		}
		// go-redis ignores a cluster URL's path; a database number there is a mistake.
		if u, err := url.Parse(rawURL); err == nil && strings.Trim(u.Path, "/") != "" && strings.Trim(u.Path, "/") != "0" {
			return fail("cluster mode has only database 0")
		}
		o = &redis.UniversalOptions{
			Addrs: p.Addrs, IsClusterMode: true, ClientName: p.ClientName, Protocol: p.Protocol,
			Username: p.Username, Password: p.Password, TLSConfig: p.TLSConfig, MaxRedirects: p.MaxRedirects,
			MaxRetries: p.MaxRetries, MinRetryBackoff: p.MinRetryBackoff, MaxRetryBackoff: p.MaxRetryBackoff,
			DialTimeout: p.DialTimeout, DialerRetries: p.DialerRetries, DialerRetryTimeout: p.DialerRetryTimeout,
			ReadTimeout: p.ReadTimeout, WriteTimeout: p.WriteTimeout,
			PoolFIFO: p.PoolFIFO, PoolSize: p.PoolSize, PoolTimeout: p.PoolTimeout, MaxConcurrentDials: p.MaxConcurrentDials,
			MinIdleConns: p.MinIdleConns, MaxIdleConns: p.MaxIdleConns, MaxActiveConns: p.MaxActiveConns,
			ConnMaxIdleTime: p.ConnMaxIdleTime, ConnMaxLifetime: p.ConnMaxLifetime, ConnMaxLifetimeJitter: p.ConnMaxLifetimeJitter,
			PipelinePoolSize: p.PipelinePoolSize, PipelineReadBufferSize: p.PipelineReadBufferSize, PipelineWriteBufferSize: p.PipelineWriteBufferSize,
			FailingTimeoutSeconds: p.FailingTimeoutSeconds,
		}
	default:
		return nil, fmt.Errorf("redislock: mode %q: must be single, sentinel or cluster", mode)
	}
	for _, a := range o.Addrs {
		if !strings.Contains(a, ",") {
			continue
		}
		if mode == ModeSingle {
			return fail("single mode takes one host:port")
		}
		return fail("one host:port before the path; further addresses go in ?addr=host:port options (go-redis' URL format)")
	}
	if o.TLSConfig != nil {
		o.TLSConfig.MinVersion = tls.VersionTLS12
		if mode != ModeSingle {
			// Sentinels, masters and cluster nodes have names of their own:
			// let crypto/tls take each from the address it dials.
			o.TLSConfig.ServerName = ""
		}
	}
	// go-redis leaves an option it was not given at 0 and marks a disabled
	// one -1; give the ones not given this package's defaults.
	o.DialTimeout = cmp.Or(o.DialTimeout, DefaultDialTimeout)
	o.ReadTimeout = cmp.Or(o.ReadTimeout, DefaultReadTimeout)
	o.WriteTimeout = cmp.Or(o.WriteTimeout, DefaultWriteTimeout)
	o.PoolTimeout = cmp.Or(o.PoolTimeout, DefaultPoolTimeout)
	o.MaxRetries = cmp.Or(o.MaxRetries, DefaultMaxRetries)
	o.PoolSize = cmp.Or(o.PoolSize, max(32, 10*runtime.GOMAXPROCS(0)))
	o.DialerRetries = cmp.Or(o.DialerRetries, 1)
	o.DialerRetryTimeout = cmp.Or(o.DialerRetryTimeout, 50*time.Millisecond)
	o.ContextTimeoutEnabled = true
	o.DisableIdentity = true
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	return o, nil
}

// parseError turns a go-redis URL error into a message that holds no part
// of the URL: url.Parse's errors quote the whole URL (password included),
// and go-redis' quote the offending option value.
func parseError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return "not a valid URL (percent-encode a '%', '#', '/', '?' or '@' in the user name or password: %25 %23 %2F %3F %40)"
	}
	msg := strings.TrimPrefix(err.Error(), "redis: ")
	if names, ok := strings.CutPrefix(msg, "unexpected option: "); ok {
		for _, n := range strings.Split(names, ", ") {
			if !optionName(n) {
				return "unknown options"
			}
		}
		return "unknown option " + names
	}
	if i := strings.Index(msg, ": "); i >= 0 {
		msg = msg[:i] // "invalid dial_timeout duration: <value>" -> the name only
	}
	return msg
}

// optionName accepts what go-redis option names look like (snake_case or
// camelCase words), so that a name made of a stray piece of a secret is not
// echoed.
func optionName(s string) bool {
	if s == "" || len(s) > 40 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r == '_') {
			return false
		}
	}
	return true
}

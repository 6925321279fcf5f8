package redislock

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/telco-platform/coordinator/internal/ownership"
)

// The Locker's configuration: its fields, defaults and checks.

// Config configures New. Defaults are filled by New.
type Config struct {
	// Prefix starts every Redis key. Default "coordinator". No braces or
	// whitespace; glob characters are matched literally.
	Prefix string
	// Owner is the replica id written into every lock. Required.
	Owner string
	// WaitTime bounds how long Acquire blocks on a held key. Default 5s.
	WaitTime time.Duration
	// WatchdogTimeout is the TTL of watchdog-managed leases, renewed every
	// third of it. Default 30s; at least 30ms.
	WatchdogTimeout time.Duration
	// WaitReplicas is how many replicas must acknowledge (Redis WAIT) an
	// acquisition or a renewal before it counts: ReplicasAuto (0, the
	// default) waits for the replicas the master reports online, ReplicasNone
	// (-1) never waits, N > 0 waits for N. See docs/lock.md.
	WaitReplicas int
	// ReplicaTimeout bounds each WAIT. Default 200ms.
	ReplicaTimeout time.Duration
	// MinTrust is how long an acquisition must still be trusted for when
	// its reply arrives. One that comes back later (Redis stalled, the
	// reply was slow) is given back at once, deleted by its token, and the
	// wait goes on within WaitTime. Default 0: only an acquisition already
	// past its trust deadline is given back. A holder that needs time to
	// stop its work before the deadline (coordinator lock: the grace and
	// the kill margin) sets that.
	MinTrust time.Duration
	// Logger receives lease losses and renewal trouble. Default: discard.
	Logger *slog.Logger
	// Metrics receives the coordinator_lock_* series. Default none.
	Metrics *ownership.Metrics
	// Layout is how locks are laid out in Redis: LayoutCoordinator (the
	// default) or LayoutRedisson (the lock of key K is Redisson's RLock
	// named K; docs/lock.md "Mixed fleets with Redisson").
	Layout Layout
}

// WaitReplicas values besides a count.
const (
	ReplicasAuto = 0
	ReplicasNone = -1
)

func (c *Config) defaults() {
	c.Prefix = cmp.Or(c.Prefix, DefaultPrefix)
	c.WaitTime = cmp.Or(c.WaitTime, ownership.DefaultWaitTime)
	c.WatchdogTimeout = cmp.Or(c.WatchdogTimeout, ownership.DefaultWatchdogTimeout)
	c.ReplicaTimeout = cmp.Or(c.ReplicaTimeout, DefaultReplicaTimeout)
	c.Layout = cmp.Or(c.Layout, LayoutCoordinator)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

func (c Config) validate() error {
	switch {
	case c.Owner == "":
		return errors.New("redislock: Config.Owner is required")
	case strings.ContainsAny(c.Prefix, "{} \t\r\n"):
		return fmt.Errorf("redislock: Config.Prefix %q must not contain braces or whitespace", c.Prefix)
	case c.WaitTime < 0:
		return fmt.Errorf("redislock: Config.WaitTime %s is negative", c.WaitTime)
	case c.WatchdogTimeout < 30*time.Millisecond:
		return fmt.Errorf("redislock: Config.WatchdogTimeout %s is below 30ms", c.WatchdogTimeout)
	case c.WaitReplicas < ReplicasNone:
		return fmt.Errorf("redislock: Config.WaitReplicas %d: must be -1 (none), 0 (auto) or a count", c.WaitReplicas)
	case c.MinTrust < 0:
		return fmt.Errorf("redislock: Config.MinTrust %s is negative", c.MinTrust)
	case c.ReplicaTimeout < 0 || c.ReplicaTimeout >= DefaultReadTimeout:
		return fmt.Errorf("redislock: Config.ReplicaTimeout %s: must be positive and below the read timeout %s", c.ReplicaTimeout, DefaultReadTimeout)
	case c.Layout != LayoutCoordinator && c.Layout != LayoutRedisson:
		return fmt.Errorf("redislock: Config.Layout %q: must be %q or %q", c.Layout, LayoutCoordinator, LayoutRedisson)
	case c.Layout == LayoutRedisson && strings.HasPrefix(c.Owner, RedissonOwnerPrefix):
		// The owner a waiter sees tells a Redisson holder from a replica.
		return fmt.Errorf("redislock: Config.Owner %q: must not start with %q in the redisson layout", c.Owner, RedissonOwnerPrefix)
	}
	return nil
}

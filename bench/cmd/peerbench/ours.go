package main

import (
	"context"
	"fmt"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
)

// ours is this repository's Redis Locker, used through the ownership port as
// the service uses it: explicit leases for a-c, watchdog leases (lease 0)
// for d and e, lease.Done() as the loss signal.
type ours struct {
	c   *redis.Client
	l   *redislock.Locker
	cfg libConfig
}

const oursPrefix = "peerbench-ours"

func newOurs(c libConfig) (lib, error) {
	cl := c.client(64)
	l, err := redislock.New(cl, redislock.Config{
		Prefix:          oursPrefix,
		Owner:           fmt.Sprintf("peerbench-%d", os.Getpid()),
		WaitTime:        c.wait,
		WatchdogTimeout: c.watchdog,
		Logger:          quietLogger(),
	})
	if err != nil {
		_ = cl.Close()
		return nil, err
	}
	return &ours{c: cl, l: l, cfg: c}, nil
}

func (o *ours) redisKey(key string) string { return oursPrefix + ":{" + key + "}:lock" }

func (o *ours) close() error {
	err := o.l.Close()
	if cerr := o.c.Close(); err == nil {
		err = cerr
	}
	return err
}

func (o *ours) lock(ctx context.Context, key string) (held, error) {
	l, err := o.l.Acquire(ctx, key, o.cfg.ttl)
	if err != nil {
		return nil, err
	}
	return oursHeld{l}, nil
}

func (o *ours) hold(ctx context.Context, key string) (held, error) {
	l, err := o.l.Acquire(ctx, key, 0)
	if err != nil {
		return nil, err
	}
	return oursHeld{l}, nil
}

type oursHeld struct{ l ownership.Lease }

func (h oursHeld) release(ctx context.Context) error { return h.l.Release(ctx) }
func (h oursHeld) lost() <-chan struct{}             { return h.l.Done() }

func init() {
	libs = append([]libSpec{{
		name: ourName, desc: "internal/ownership/redislock, explicit 30 s lease", workloads: "abcde", build: newOurs,
		holdDesc:      "Acquire(ctx, key, 0): watchdog lease, 30 s TTL, one renewal loop per Locker",
		lostMechanism: "lease.Done() closes (watchdog renewal finds the lock gone)",
	}}, libs...)
}

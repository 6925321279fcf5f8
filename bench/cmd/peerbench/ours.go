package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

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

// oursPerWorker gives every contending worker a Locker (and client) of its
// own, as replicas in separate processes have: waiters then learn of a
// release through Redis pub/sub, not through the Locker's local queue.
type oursPerWorker struct {
	cfg     libConfig
	mu      sync.Mutex
	lockers map[int]*ours
}

func newOursPerWorker(c libConfig) (lib, error) {
	return &oursPerWorker{cfg: c, lockers: map[int]*ours{}}, nil
}

func (o *oursPerWorker) get(ctx context.Context) (*ours, error) {
	w, _ := ctx.Value(workerKey{}).(int)
	o.mu.Lock()
	defer o.mu.Unlock()
	if l, ok := o.lockers[w]; ok {
		return l, nil
	}
	cl := redis.NewClient(&redis.Options{Addr: o.cfg.addr, PoolSize: 4})
	l, err := redislock.New(cl, redislock.Config{
		Prefix:          oursPrefix,
		Owner:           fmt.Sprintf("peerbench-%d-w%d", os.Getpid(), w),
		WaitTime:        o.cfg.wait,
		WatchdogTimeout: o.cfg.watchdog,
		Logger:          quietLogger(),
	})
	if err != nil {
		_ = cl.Close()
		return nil, err
	}
	ol := &ours{c: cl, l: l, cfg: o.cfg}
	o.lockers[w] = ol
	return ol, nil
}

func (o *oursPerWorker) redisKey(key string) string { return oursPrefix + ":{" + key + "}:lock" }

func (o *oursPerWorker) lock(ctx context.Context, key string) (held, error) {
	l, err := o.get(ctx)
	if err != nil {
		return nil, err
	}
	return l.lock(ctx, key)
}

func (o *oursPerWorker) hold(ctx context.Context, key string) (held, error) {
	l, err := o.get(ctx)
	if err != nil {
		return nil, err
	}
	return l.hold(ctx, key)
}

func (o *oursPerWorker) close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	var errs []error
	for _, l := range o.lockers {
		errs = append(errs, l.close())
	}
	return errors.Join(errs...)
}

func init() {
	libs = append([]libSpec{{
		name: ourName, desc: "internal/ownership/redislock, explicit 30 s lease", workloads: "abcde", build: newOurs,
		holdDesc:      "Acquire(ctx, key, 0): watchdog lease, 30 s TTL, one renewal loop per Locker",
		lostMechanism: "lease.Done() closes (watchdog renewal finds the lock gone)",
	}, {
		name: ourPerWorkerName, desc: "internal/ownership/redislock, one Locker and client per worker (as separate replicas)", workloads: "c", build: newOursPerWorker,
	}}, libs...)
}

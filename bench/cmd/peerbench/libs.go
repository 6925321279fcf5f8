package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	bsmlock "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncgoredis "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// lib is one lock library under test. Every workload goes through this
// interface, so the harness code around a library is identical for all.
type lib interface {
	// lock takes key with an explicit TTL (no renewal), waiting as the
	// library waits, bounded by ctx.
	lock(ctx context.Context, key string) (held, error)
	// hold takes key the way a user keeps a lock for as long as the process
	// needs it: the library's watchdog, or its extend/refresh API on a ticker
	// per lock where it has no watchdog.
	hold(ctx context.Context, key string) (held, error)
	// redisKey is the Redis key the library stores key's lock under.
	redisKey(key string) string
	close() error
}

// held is one acquired lock.
type held interface {
	release(ctx context.Context) error
	// lost is closed when the holder learns the lock is gone; nil when the
	// library has no way to tell.
	lost() <-chan struct{}
}

// libConfig is what every library constructor gets.
type libConfig struct {
	addr string
	// ttl of explicit locks (workloads a, b, c).
	ttl time.Duration
	// watchdog is the TTL of held locks (workloads d, e); renewal runs every
	// third of it.
	watchdog time.Duration
	// wait bounds a blocking acquisition.
	wait time.Duration
}

func (c libConfig) client(poolSize int) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: c.addr, PoolSize: poolSize})
}

// libSpec names a library and the workloads it takes part in.
type libSpec struct {
	name      string
	desc      string
	workloads string // letters a..e
	build     func(c libConfig) (lib, error)
	// holdDesc says how the library keeps a lock held (d, e).
	holdDesc string
	// lostMechanism says how the holder learns of a lost lock (e).
	lostMechanism string
}

var errNotObtained = errors.New("peerbench: lock not obtained")

// ---------------------------------------------------------------- raw floor

// rawCAD is the compare-and-delete every Redis lock releases with.
var rawCAD = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)

// raw is the floor: SET NX PX to acquire, a Lua compare-and-delete to
// release. It does not wait: it only takes part in uncontended workloads.
type raw struct {
	c   *redis.Client
	cfg libConfig
	seq atomic.Int64
}

func newRaw(c libConfig) (lib, error) { return &raw{c: c.client(64), cfg: c}, nil }

func (r *raw) redisKey(key string) string { return "raw:" + key }
func (r *raw) close() error               { return r.c.Close() }

func (r *raw) lock(ctx context.Context, key string) (held, error) {
	token := "raw-" + strconv.FormatInt(r.seq.Add(1), 10)
	ok, err := r.c.SetNX(ctx, r.redisKey(key), token, r.cfg.ttl).Result()
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errNotObtained
	}
	return &rawHeld{r: r, key: r.redisKey(key), token: token}, nil
}

func (r *raw) hold(context.Context, string) (held, error) {
	return nil, errors.New("peerbench: raw floor has no renewal")
}

type rawHeld struct {
	r     *raw
	key   string
	token string
}

func (h *rawHeld) release(ctx context.Context) error {
	n, err := rawCAD.Run(ctx, h.r.c, []string{h.key}, h.token).Int()
	if err != nil {
		return err
	}
	if n != 1 {
		return errors.New("peerbench: raw release found another token")
	}
	return nil
}

func (h *rawHeld) lost() <-chan struct{} { return nil }

// ---------------------------------------------------------- round-trip limit

// emptyScript is EVALSHA of an empty script: the cost of one round trip to
// Redis that runs Lua, which every lock operation is at least.
var emptyScript = redis.NewScript(``)

// limit does two EVALSHA of the empty script per "pair" (one for acquire, one
// for release): the round-trip limit of any Redis lock that needs one round
// trip each way.
type limit struct{ c *redis.Client }

func newLimit(c libConfig) (lib, error) { return &limit{c: c.client(64)}, nil }

func (l *limit) redisKey(key string) string { return key }
func (l *limit) close() error               { return l.c.Close() }

func (l *limit) lock(ctx context.Context, _ string) (held, error) {
	if err := emptyScript.Run(ctx, l.c, nil).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	return limitHeld{l}, nil
}

func (l *limit) hold(context.Context, string) (held, error) {
	return nil, errors.New("peerbench: round-trip limit holds nothing")
}

type limitHeld struct{ l *limit }

func (h limitHeld) release(ctx context.Context) error {
	if err := emptyScript.Run(ctx, h.l.c, nil).Err(); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	return nil
}

func (h limitHeld) lost() <-chan struct{} { return nil }

// ------------------------------------------------------------------ redsync

// rsync is redsync v4 on one go-redis pool. opts are added to every mutex;
// default = none (expiry 8 s, 32 tries, 50-250 ms random retry delay).
type rsync struct {
	c    *redis.Client
	rs   *redsync.Redsync
	cfg  libConfig
	opts []redsync.Option
}

func newRedsyncDefault(c libConfig) (lib, error) {
	cl := c.client(64)
	return &rsync{c: cl, rs: redsync.New(redsyncgoredis.NewPool(cl)), cfg: c}, nil
}

// newRedsyncTuned retries every 1 ms, with tries enough to wait as long as
// the other libraries (cfg.wait).
func newRedsyncTuned(c libConfig) (lib, error) {
	cl := c.client(64)
	tries := max(int(c.wait/time.Millisecond), 1)
	return &rsync{c: cl, rs: redsync.New(redsyncgoredis.NewPool(cl)), cfg: c,
		opts: []redsync.Option{redsync.WithRetryDelay(time.Millisecond), redsync.WithTries(tries)}}, nil
}

func (r *rsync) redisKey(key string) string { return "redsync:" + key }
func (r *rsync) close() error               { return r.c.Close() }

func (r *rsync) lock(ctx context.Context, key string) (held, error) {
	m := r.rs.NewMutex(r.redisKey(key), r.opts...)
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return &rsyncHeld{m: m}, nil
}

// hold is redsync as its README suggests for long work: a mutex with an
// expiry, and Extend called on a ticker (every third of the expiry) for as
// long as the lock is needed. A failed Extend is how the holder learns of
// the loss.
func (r *rsync) hold(ctx context.Context, key string) (held, error) {
	opts := append([]redsync.Option{redsync.WithExpiry(r.cfg.watchdog)}, r.opts...)
	m := r.rs.NewMutex(r.redisKey(key), opts...)
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	h := &rsyncHeld{m: m}
	h.startRenewal(r.cfg.watchdog/3, func(ctx context.Context) (bool, error) { return m.ExtendContext(ctx) })
	return h, nil
}

type rsyncHeld struct {
	m *redsync.Mutex
	renewal
}

func (h *rsyncHeld) release(ctx context.Context) error {
	h.stopRenewal()
	ok, err := h.m.UnlockContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("peerbench: redsync unlock failed")
	}
	return nil
}

// ---------------------------------------------------------- bsm/redislock

// bsm is bsm/redislock with a linear 1 ms retry strategy.
type bsm struct {
	c   *redis.Client
	l   *bsmlock.Client
	cfg libConfig
}

func newBSM(c libConfig) (lib, error) {
	cl := c.client(64)
	return &bsm{c: cl, l: bsmlock.New(cl), cfg: c}, nil
}

func (b *bsm) redisKey(key string) string { return "bsm:" + key }
func (b *bsm) close() error               { return b.c.Close() }

func (b *bsm) opts() *bsmlock.Options {
	return &bsmlock.Options{RetryStrategy: bsmlock.LinearBackoff(time.Millisecond)}
}

func (b *bsm) lock(ctx context.Context, key string) (held, error) {
	l, err := b.l.Obtain(ctx, b.redisKey(key), b.cfg.ttl, b.opts())
	if err != nil {
		return nil, err
	}
	return &bsmHeld{l: l}, nil
}

// hold is redislock as its README suggests: Refresh on a ticker (every third
// of the TTL); ErrNotObtained from Refresh tells the holder the lock is gone.
func (b *bsm) hold(ctx context.Context, key string) (held, error) {
	l, err := b.l.Obtain(ctx, b.redisKey(key), b.cfg.watchdog, b.opts())
	if err != nil {
		return nil, err
	}
	h := &bsmHeld{l: l}
	ttl := b.cfg.watchdog
	h.startRenewal(ttl/3, func(ctx context.Context) (bool, error) {
		err := l.Refresh(ctx, ttl, nil)
		if errors.Is(err, bsmlock.ErrNotObtained) {
			return false, nil
		}
		return err == nil, err
	})
	return h, nil
}

type bsmHeld struct {
	l *bsmlock.Lock
	renewal
}

func (h *bsmHeld) release(ctx context.Context) error {
	h.stopRenewal()
	return h.l.Release(ctx)
}

// ---------------------------------------------------------------- renewal

// renewal is the per-lock ticker goroutine users of redsync and redislock
// write: extend every period; the first extension that finds the lock gone
// closes lostCh. Errors other than "not held" are retried at the next tick.
type renewal struct {
	lostCh   chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

func (r *renewal) startRenewal(period time.Duration, extend func(ctx context.Context) (bool, error)) {
	r.lostCh = make(chan struct{})
	r.stop = make(chan struct{})
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), period)
			ok, err := extend(ctx)
			cancel()
			if !ok && err == nil || errors.Is(err, redsync.ErrExtendFailed) || isTaken(err) {
				close(r.lostCh)
				return
			}
		}
	}()
}

// isTaken reports redsync's "lock taken"/"extend failed" errors, which mean
// the lock is no longer ours.
func isTaken(err error) bool {
	var taken *redsync.ErrTaken
	return errors.As(err, &taken)
}

func (r *renewal) stopRenewal() {
	if r.stop == nil {
		return
	}
	r.stopOnce.Do(func() { close(r.stop) })
	r.wg.Wait()
}

func (r *renewal) lost() <-chan struct{} { return r.lostCh }

// libs lists every Go library, in report order. ours is added by
// registerOurs when the Redis Locker is built in.
var libs = []libSpec{
	{name: "raw floor", desc: "go-redis SET NX PX + Lua compare-and-delete", workloads: "ab", build: newRaw},
	{name: "round-trip limit", desc: "2 x EVALSHA of an empty script per pair", workloads: "ab", build: newLimit},
	{name: "redsync (default)", desc: "redsync v4 default options (32 tries, 50-250 ms random retry delay)", workloads: "abcde", build: newRedsyncDefault,
		holdDesc:      "redsync Mutex (expiry 30 s) + ExtendContext on a ticker every 10 s, one goroutine per lock",
		lostMechanism: "ExtendContext on a ticker every TTL/3 fails"},
	{name: "redsync (1 ms retry)", desc: "redsync v4 WithRetryDelay(1ms), tries = wait / 1 ms", workloads: "abc", build: newRedsyncTuned},
	{name: "bsm/redislock", desc: "bsm/redislock LinearBackoff(1ms)", workloads: "abcde", build: newBSM,
		holdDesc:      "redislock Obtain (TTL 30 s) + Refresh on a ticker every 10 s, one goroutine per lock",
		lostMechanism: "Refresh on a ticker every TTL/3 returns ErrNotObtained"},
}

func findLib(name string) (libSpec, error) {
	for _, s := range libs {
		if s.name == name {
			return s, nil
		}
	}
	return libSpec{}, fmt.Errorf("peerbench: unknown library %q", name)
}

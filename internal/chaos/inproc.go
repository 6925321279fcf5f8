package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/ownership/redislock"
)

// In-process lock workers: redislock.Locker inside the verifier, each worker
// a "process" of its own (its own go-redis client, Locker, owner id and
// proxies to Redis and PostgreSQL), looping acquire, a few fenced writes,
// release. They add many cheap acquisitions beside the `coordinator lock`
// processes, and they write to a fenced store: chaos.fenced_write accepts a
// write only if its fence is at least the highest the key has accepted, as a
// store that fences on the lock's token would. A holder cut off from Redis
// past its lease may still write (its write in flight, or PostgreSQL
// reachable while Redis is not); the store must refuse it once a newer
// holder has written, and the checker verifies that no two holders' writes
// were ever accepted interleaved.

// Settings of the in-process Lockers (the `coordinator lock` workers'
// watchdog TTL, wait and explicit leases).
const (
	inprocWait       = 2 * time.Second
	inprocWriteBound = 2 * time.Second
)

type inprocWorker struct {
	r    *run
	idx  int
	host string
	key  string

	client  redis.UniversalClient
	locker  *redislock.Locker
	pool    *pgxpool.Pool
	logFile *os.File

	mu  sync.Mutex
	cur *InprocSection // the lease held now, if any
}

// startInproc builds the in-process workers (they start looping with the
// fault phase).
func (r *run) startInproc(ctx context.Context) error {
	// go-redis has one logger per process: the in-process workers' lines go
	// to a file of their own, not to the verifier's output.
	f, err := os.OpenFile(filepath.Join(r.logs, "inproc-go-redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	r.closers = append(r.closers, f.Close)
	redislock.SetLogger(slog.New(slog.NewJSONHandler(f, nil)))
	for w := 0; w < r.cfg.InprocWorkers; w++ {
		iw := &inprocWorker{r: r, idx: w, host: inprocHost(w), key: fmt.Sprintf("chaos-inproc-%d", w%r.cfg.InprocKeys)}
		r.inproc = append(r.inproc, iw)
		if err := iw.open(ctx); err != nil {
			return fmt.Errorf("in-process worker %d: %w", w, err)
		}
	}
	return nil
}

func (iw *inprocWorker) open(ctx context.Context) error {
	r := iw.r
	opts, err := redislock.ParseOptions(r.redis.URL(), redislock.ModeSentinel)
	if err != nil {
		return err
	}
	m := r.net.dialMap(iw.host)
	d := &net.Dialer{Timeout: opts.DialTimeout, KeepAlive: 5 * time.Minute}
	opts.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if to, ok := m[addr]; ok {
			addr = to
		}
		return d.DialContext(ctx, network, addr)
	}
	if iw.logFile, err = os.OpenFile(filepath.Join(r.logs, "inproc-"+iw.host+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return err
	}
	iw.client = redis.NewUniversalClient(opts)
	if iw.locker, err = redislock.New(iw.client, redislock.Config{
		Owner: iw.host, WaitTime: inprocWait, WatchdogTimeout: lockWatchdogTTL,
		Logger: slog.New(slog.NewJSONHandler(iw.logFile, nil)).With("worker", iw.host),
	}); err != nil {
		return err
	}
	pc, err := pgxpool.ParseConfig(r.hostDSN(iw.host) + "&pool_max_conns=2&connect_timeout=2")
	if err != nil {
		return err
	}
	iw.pool, err = pgxpool.NewWithConfig(ctx, pc)
	return err
}

func (iw *inprocWorker) close() {
	if iw.locker != nil {
		_ = iw.locker.Close()
	}
	if iw.client != nil {
		_ = iw.client.Close()
	}
	if iw.pool != nil {
		iw.pool.Close()
	}
	if iw.logFile != nil {
		_ = iw.logFile.Close()
	}
}

// current is the section of the lease held now.
func (iw *inprocWorker) current() (InprocSection, bool) {
	iw.mu.Lock()
	defer iw.mu.Unlock()
	if iw.cur == nil {
		return InprocSection{}, false
	}
	return *iw.cur, true
}

// loop acquires, writes and releases until ctx ends, with parameters drawn
// from the seed: the watchdog or an explicit lease of 1.5-3 s, 1-3 fenced
// writes 5-60 ms apart, or (one in 25) 5-12 writes 100-250 ms apart.
func (iw *inprocWorker) loop(ctx context.Context) {
	r := iw.r
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0x1b0c+uint64(iw.idx)))
	for n := 1; ctx.Err() == nil; n++ {
		var lease time.Duration
		if rng.IntN(100) < 50 {
			lease = between(rng, 1500*time.Millisecond, 3*time.Second).Round(time.Millisecond)
		}
		writes := 1 + rng.IntN(3)
		gap := between(rng, 5*time.Millisecond, 60*time.Millisecond)
		if rng.IntN(100) < 4 {
			// A long holder (0.5-3 s): an explicit lease may end in the
			// middle of it, and a partition may meet it holding.
			writes, gap = 5+rng.IntN(8), between(rng, 100*time.Millisecond, 250*time.Millisecond)
		}
		rest := between(rng, 0, 60*time.Millisecond)
		call := Mono()
		actx, cancel := context.WithTimeout(ctx, inprocWait+3*time.Second)
		l, err := iw.locker.Acquire(actx, iw.key, lease)
		cancel()
		if err != nil {
			r.mu.Lock()
			if errors.Is(err, ownership.ErrAlreadyOwned) {
				r.hist.InprocBusy++
			} else {
				r.hist.InprocUnavailable++
			}
			r.mu.Unlock()
			pause(ctx, between(rng, 20*time.Millisecond, 200*time.Millisecond))
			continue
		}
		s := &InprocSection{Worker: iw.idx, Key: iw.key, Holder: fmt.Sprintf("%s-%d", iw.host, n), Fence: l.Fence(),
			Lease: lease, CallNS: call, AcquiredNS: Mono()}
		iw.mu.Lock()
		iw.cur = s
		iw.mu.Unlock()
		for i := 0; i < writes && pause(l.Context(), gap); i++ {
			iw.write(l.Context(), s)
		}
		if l.Err() != nil {
			s.LostNS = Mono()
		}
		rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = l.Release(rctx)
		rcancel()
		s.EndNS = Mono()
		iw.mu.Lock()
		iw.cur = nil
		iw.mu.Unlock()
		r.mu.Lock()
		r.hist.Inproc = append(r.hist.Inproc, *s)
		r.mu.Unlock()
		pause(ctx, rest)
	}
}

// write is one fenced write under the lease's context (cancelled when the
// lease ends): accepted, refused, or unknown (an error, a timeout: it may
// have committed; the table is the truth).
func (iw *inprocWorker) write(ctx context.Context, s *InprocSection) {
	wctx, cancel := context.WithTimeout(ctx, inprocWriteBound)
	defer cancel()
	var ok bool
	err := iw.pool.QueryRow(wctx, `select chaos.fenced_write($1, $2, $3, $4)`, s.Key, s.Fence, s.Holder, Mono()).Scan(&ok)
	switch {
	case err != nil:
		s.Unknown++
	case ok:
		s.Accepted++
	default:
		s.Refused++
	}
}

// inprocByHost is the in-process worker of host (nil if it is not one).
func (r *run) inprocByHost(host string) *inprocWorker {
	for _, iw := range r.inproc {
		if iw.host == host {
			return iw
		}
	}
	return nil
}

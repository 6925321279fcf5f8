package msisdnreaper

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func newPool(t *testing.T) (*testenv.PG, *Pool, *ownership.MemoryLocker) {
	t.Helper()
	pg := testenv.Postgres(t)
	l := memLocker(t, "replica-a", 100*time.Millisecond)
	return pg, NewPool(pg.Pool, l), l
}

func TestPoolLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, p, _ := newPool(t)
	got, err := p.Replenish(ctx, List("447700900003", "447700900001", "447700900002"))
	require.NoError(t, err)
	require.Equal(t, Replenished{Added: 3}, got)

	r, err := p.Reserve(ctx, "shop-1", time.Minute)
	require.NoError(t, err)
	require.Equal(t, "447700900001", r.MSISDN, "the lowest free number is taken")
	require.Equal(t, "shop-1", r.ReservedBy)
	require.WithinDuration(t, time.Now().Add(time.Minute), r.ReservedUntil, 10*time.Second)
	require.Len(t, r.Token, 32, "128 random bits in hex")

	require.NoError(t, p.Allocate(ctx, r.MSISDN, r.Token, 42))
	n, err := p.Get(ctx, r.MSISDN)
	require.NoError(t, err)
	require.Equal(t, StateAllocated, n.State)
	require.Equal(t, int64(42), *n.SubscriberID)
	require.Nil(t, n.ReservedUntil)

	// A retried allocation to the same subscriber succeeds; to another it is refused.
	require.NoError(t, p.Allocate(ctx, r.MSISDN, r.Token, 42))
	err = p.Allocate(ctx, r.MSISDN, r.Token, 43)
	var te *TransitionError
	require.ErrorAs(t, err, &te)
	require.Equal(t, TransitionError{MSISDN: r.MSISDN, From: StateAllocated, To: StateAllocated}, *te)
	require.ErrorIs(t, err, ErrIllegalTransition)
	require.NotErrorIs(t, err, ErrReservationExpired)

	err = p.Release(ctx, r.MSISDN, r.Token)
	require.ErrorIs(t, err, ErrIllegalTransition, "an allocated number is not released")
	require.ErrorContains(t, err, "ALLOCATED -> FREE")

	r2, err := p.Reserve(ctx, "shop-2", time.Minute)
	require.NoError(t, err)
	require.Equal(t, "447700900002", r2.MSISDN)
	require.NotEqual(t, r.Token, r2.Token)
	require.ErrorIs(t, p.Release(ctx, r2.MSISDN, r.Token), ErrNotReservationHolder, "another reservation's token")
	require.NoError(t, p.Release(ctx, r2.MSISDN, r2.Token))
	n, err = p.Get(ctx, r2.MSISDN)
	require.NoError(t, err)
	require.Equal(t, Number{MSISDN: r2.MSISDN, State: StateFree}, n)
	require.ErrorIs(t, p.Release(ctx, r2.MSISDN, r2.Token), ErrIllegalTransition, "releasing a FREE number")
	require.ErrorIs(t, p.Allocate(ctx, r2.MSISDN, r2.Token, 7), ErrIllegalTransition, "allocating a FREE number")
	require.NotErrorIs(t, p.Allocate(ctx, r2.MSISDN, r2.Token, 7), ErrNotReservationHolder, "a FREE number has no holder")

	_, err = p.Reserve(ctx, "shop-3", time.Minute)
	require.NoError(t, err)
	_, err = p.Reserve(ctx, "shop-3", time.Minute)
	require.NoError(t, err)
	_, err = p.Reserve(ctx, "shop-3", time.Minute)
	require.ErrorIs(t, err, ErrPoolExhausted)

	require.ErrorIs(t, p.Allocate(ctx, "447700999999", "t", 1), ErrNotFound)
	require.ErrorIs(t, p.Release(ctx, "447700999999", "t"), ErrNotFound)
	_, err = p.Get(ctx, "447700999999")
	require.ErrorIs(t, err, ErrNotFound)
}

func TestPoolBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, p, _ := newPool(t)
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"reserve empty by", func() error { _, err := p.Reserve(ctx, "", time.Minute); return err }()},
		{"reserve zero hold", func() error { _, err := p.Reserve(ctx, "x", 0); return err }()},
		{"reserve huge hold", func() error { _, err := p.Reserve(ctx, "x", MaxHold+time.Second); return err }()},
		{"allocate letters", p.Allocate(ctx, "44770090000a", "t", 1)},
		{"allocate no token", p.Allocate(ctx, "447700900001", "", 1)},
		{"release short", p.Release(ctx, "123", "t")},
		{"release no token", p.Release(ctx, "447700900001", "")},
		{"range reversed", func() error { _, err := p.Replenish(ctx, Range("447700000009", "447700000000")); return err }()},
		{"range lengths", func() error { _, err := p.Replenish(ctx, Range("447700000000", "4477000000099")); return err }()},
		{"list with a bad one", func() error {
			_, err := p.Replenish(ctx, Range("447700000000", "447700000009"), List("447700000100", "+447700000101"))
			return err
		}()},
		{"too many", func() error { _, err := p.Replenish(ctx, Range("100000000000", "100099999999")); return err }()},
	} {
		require.ErrorIs(t, tc.err, job.ErrBadInput, tc.name)
	}
	require.Empty(t, counts(t, pg), "bad input changes nothing")
}

func TestAllocateRefusesExpiredReservation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, p, _ := newPool(t)
	_, err := pg.Pool.Exec(ctx, `insert into msisdn_pool (msisdn, state, reserved_until, reserved_by, reservation_token)
		values ('447700900001', 'RESERVED', now() - interval '1 second', 'shop', 'tok')`)
	require.NoError(t, err)
	err = p.Allocate(ctx, "447700900001", "tok", 5)
	require.ErrorIs(t, err, ErrReservationExpired)
	require.ErrorIs(t, err, ErrIllegalTransition)
	require.ErrorContains(t, err, "reservation expired")
	n, err := p.Get(ctx, "447700900001")
	require.NoError(t, err)
	require.Equal(t, StateReserved, n.State, "a refused transition changes nothing")
	require.Nil(t, n.SubscriberID)
	require.NotErrorIs(t, err, ErrNotReservationHolder)
	// Releasing an expired hold on purpose is allowed.
	require.NoError(t, p.Release(ctx, "447700900001", "tok"))
}

func TestReplenishIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, p, _ := newPool(t)
	got, err := p.Replenish(ctx, Range("447700000000", "447700000999"))
	require.NoError(t, err)
	require.Equal(t, Replenished{Added: 1000}, got)

	r, err := p.Reserve(ctx, "shop", time.Minute)
	require.NoError(t, err)

	got, err = p.Replenish(ctx, Range("447700000500", "447700001499"), List("447700001499", "447700002000", "447700002000"))
	require.NoError(t, err)
	require.Equal(t, Replenished{Added: 501, Existing: 501}, got)
	require.Equal(t, map[State]int64{StateFree: 1500, StateReserved: 1}, counts(t, pg))
	n, err := p.Get(ctx, r.MSISDN)
	require.NoError(t, err)
	require.Equal(t, StateReserved, n.State, "replenish leaves existing numbers as they are")

	// Leading zeros of a national-format range are kept.
	got, err = p.Replenish(ctx, Range("07700900008", "07700900011"))
	require.NoError(t, err)
	require.Equal(t, int64(4), got.Added)
	_, err = p.Get(ctx, "07700900010")
	require.NoError(t, err)
}

func TestReplenishHoldsItsLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, p, l := newPool(t)
	held, err := l.Acquire(ctx, ReplenishKey, 0)
	require.NoError(t, err)
	_, err = p.Replenish(ctx, List("447700900001"))
	require.ErrorIs(t, err, ownership.ErrAlreadyOwned)
	require.Empty(t, counts(t, pg), "nothing added without the lock")
	require.NoError(t, held.Release(ctx))
	_, err = p.Replenish(ctx, List("447700900001"))
	require.NoError(t, err)
}

func TestReserveConcurrentlyTakesDistinctNumbers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, p, _ := newPool(t)
	_, err := p.Replenish(ctx, Range("447700000000", "447700000299"))
	require.NoError(t, err)
	const goroutines, each = 8, 25
	var (
		mu   sync.Mutex
		seen = map[string]string{}
		wg   sync.WaitGroup
		errs = make(chan error, goroutines)
	)
	for g := range goroutines {
		wg.Go(func() {
			by := fmt.Sprintf("shop-%d", g)
			for range each {
				r, err := p.Reserve(ctx, by, time.Minute)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if prev, dup := seen[r.MSISDN]; dup {
					mu.Unlock()
					errs <- fmt.Errorf("%s reserved by %s and %s", r.MSISDN, prev, by)
					return
				}
				seen[r.MSISDN] = by
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, seen, goroutines*each)
	require.Equal(t, map[State]int64{StateFree: 100, StateReserved: 200}, counts(t, pg))
}

func TestValidateMSISDN(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"44770090", "447700900123", "123456789012345", "07700900123"} {
		require.NoError(t, ValidateMSISDN(ok), ok)
	}
	for _, bad := range []string{"", "4477009", "1234567890123456", "+447700900123", "4477 0090012", "44770090012x"} {
		err := ValidateMSISDN(bad)
		require.True(t, errors.Is(err, job.ErrBadInput), bad)
	}
}

// The reported race (issue 13, item 5): X reserves, its hold passes, a
// sweep frees the number, Y reserves it; X's late Allocate must not take
// Y's number.
func TestLateAllocateByAnExpiredHolderDoesNotTakeTheNextReservation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, p, l := newPool(t)
	_, err := p.Replenish(ctx, List("447700900001"))
	require.NoError(t, err)
	x, err := p.Reserve(ctx, "shop-x", time.Minute)
	require.NoError(t, err)
	_, err = pg.Pool.Exec(ctx, `update msisdn_pool set reserved_until = now() - interval '1 second' where msisdn = $1`, x.MSISDN)
	require.NoError(t, err) // X's hold has passed
	res := NewTestSweeper(pg.Pool, l, nil, Config{}).Sweep(ctx, cliTrigger)
	require.Equal(t, int64(1), res.Counts["freed"])
	y, err := p.Reserve(ctx, "shop-y", time.Minute)
	require.NoError(t, err)
	require.Equal(t, x.MSISDN, y.MSISDN, "the freed number is the next one reserved")

	err = p.Allocate(ctx, x.MSISDN, x.Token, 1)
	require.ErrorIs(t, err, ErrNotReservationHolder, "X's reservation is gone: its late Allocate must fail")
	require.ErrorIs(t, err, ErrIllegalTransition)
	require.NotErrorIs(t, err, ErrReservationExpired, "Y's hold is valid: the refusal is X's token")
	require.ErrorContains(t, err, "reservation token does not match")
	require.ErrorIs(t, p.Release(ctx, x.MSISDN, x.Token), ErrNotReservationHolder, "nor may X release Y's reservation")
	n, err := p.Get(ctx, y.MSISDN)
	require.NoError(t, err)
	require.Equal(t, StateReserved, n.State, "Y keeps the number")
	require.Equal(t, "shop-y", *n.ReservedBy)
	require.Nil(t, n.SubscriberID)

	require.NoError(t, p.Allocate(ctx, y.MSISDN, y.Token, 2), "Y allocates its number")
	err = p.Allocate(ctx, x.MSISDN, x.Token, 2)
	require.ErrorIs(t, err, ErrNotReservationHolder, "a retry by X with Y's subscriber is not mistaken for Y's retry")
	require.NoError(t, p.Allocate(ctx, y.MSISDN, y.Token, 2), "Y's retry succeeds")
}

// The same race with the same caller name on both reservations: the token,
// not reserved_by, tells them apart.
func TestLateAllocateBySameCallerNameIsRefusedToo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pg, p, l := newPool(t)
	_, err := p.Replenish(ctx, List("447700900001"))
	require.NoError(t, err)
	first, err := p.Reserve(ctx, "shop", time.Minute)
	require.NoError(t, err)
	_, err = pg.Pool.Exec(ctx, `update msisdn_pool set reserved_until = now() - interval '1 second' where msisdn = $1`, first.MSISDN)
	require.NoError(t, err)
	require.Equal(t, int64(1), NewTestSweeper(pg.Pool, l, nil, Config{}).Sweep(ctx, cliTrigger).Counts["freed"])
	var token *string
	require.NoError(t, pg.Pool.QueryRow(ctx, `select reservation_token from msisdn_pool where msisdn = $1`, first.MSISDN).Scan(&token))
	require.Nil(t, token, "the sweep clears the token")
	second, err := p.Reserve(ctx, "shop", time.Minute)
	require.NoError(t, err)
	require.ErrorIs(t, p.Allocate(ctx, first.MSISDN, first.Token, 1), ErrNotReservationHolder)
	require.NoError(t, p.Allocate(ctx, second.MSISDN, second.Token, 2))
}

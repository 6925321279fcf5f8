package msisdnreaper

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// State is a row's place in FR-13's state machine.
type State string

const (
	StateFree      State = "FREE"
	StateReserved  State = "RESERVED"
	StateAllocated State = "ALLOCATED"
)

// ReplenishKey is the lock every Replenish holds, so that two admins adding
// ranges at once take turns instead of interleaving.
const ReplenishKey = "msisdn-pool:replenish"

var (
	// ErrNotFound: the number is not in the pool.
	ErrNotFound = errors.New("msisdnreaper: msisdn not in pool")
	// ErrPoolExhausted: no FREE number could be taken (none left, or every
	// free one is being taken by a concurrent Reserve right now).
	ErrPoolExhausted = errors.New("msisdnreaper: no free msisdn in pool")
	// ErrIllegalTransition matches every *TransitionError.
	ErrIllegalTransition = errors.New("msisdnreaper: illegal state transition")
	// ErrReservationExpired matches a *TransitionError on a RESERVED row whose
	// hold has passed (by the database clock): Allocate refuses it, because
	// the reaper may free it at any moment.
	ErrReservationExpired = errors.New("msisdnreaper: reservation expired")
	// ErrNotReservationHolder matches a *TransitionError whose token is not
	// the row's: the caller's reservation ended (released, or expired and
	// swept) and the number was reserved again, or was never the caller's.
	ErrNotReservationHolder = errors.New("msisdnreaper: reservation token does not match")
)

// TransitionError says which transition was refused and why. Nothing was
// changed. It matches ErrIllegalTransition, ErrReservationExpired when
// Expired is set and ErrNotReservationHolder when NotHolder is set.
type TransitionError struct {
	MSISDN string
	// From is the row's state when the transition was refused.
	From State
	// To is the state the caller asked for.
	To State
	// Expired: From is RESERVED, the token matched, but the hold had passed.
	Expired bool
	// NotHolder: the row is RESERVED or ALLOCATED under another reservation
	// token than the caller's.
	NotHolder bool
}

func (e *TransitionError) Error() string {
	if e.NotHolder {
		return fmt.Sprintf("msisdnreaper: %s: reservation token does not match (the number is %s under another reservation: the caller's was released or expired), cannot move %s -> %s",
			e.MSISDN, e.From, e.From, e.To)
	}
	if e.Expired {
		return fmt.Sprintf("msisdnreaper: %s: reservation expired, cannot move %s -> %s", e.MSISDN, e.From, e.To)
	}
	return fmt.Sprintf("msisdnreaper: %s: illegal transition %s -> %s", e.MSISDN, e.From, e.To)
}

func (e *TransitionError) Is(target error) bool {
	return target == ErrIllegalTransition || (target == ErrReservationExpired && e.Expired) ||
		(target == ErrNotReservationHolder && e.NotHolder)
}

// Reservation is a number held for a caller until ReservedUntil (database
// clock). Token identifies this reservation: Allocate and Release need it.
type Reservation struct {
	MSISDN        string    `json:"msisdn"`
	ReservedBy    string    `json:"reserved_by"`
	ReservedUntil time.Time `json:"reserved_until"`
	Token         string    `json:"token"`
}

// Pool runs the pool's state transitions. Each operation is one statement
// (one transaction) whose WHERE clause is the transition's precondition, so a
// refused transition changes nothing and two racing callers cannot both win:
// the row lock serialises them and the loser's precondition is re-checked on
// the winner's version of the row.
type Pool struct {
	db     *pgxpool.Pool
	locker ownership.Locker
}

// NewPool returns the pool operations on db. locker guards Replenish.
func NewPool(db *pgxpool.Pool, locker ownership.Locker) *Pool {
	return &Pool{db: db, locker: locker}
}

// MaxHold bounds a reservation's hold.
const MaxHold = 7 * 24 * time.Hour

const sqlReserve = `
update msisdn_pool
   set state = 'RESERVED',
       reserved_until = now() + $2::bigint * interval '1 microsecond',
       reserved_by = $1,
       reservation_token = $3,
       subscriber_id = null,
       updated_at = now()
 where msisdn = (select msisdn from msisdn_pool
                  where state = 'FREE'
                  order by msisdn
                  limit 1
                  for update skip locked)
   and state = 'FREE'
returning msisdn, reserved_until`

// Reserve takes the lowest FREE number (skipping rows other Reserves hold
// locked) and holds it for reservedBy until now()+hold on the database clock,
// under a fresh random token (Reservation.Token) that Allocate and Release
// match.
// It returns ErrPoolExhausted when no free number could be taken and an
// error wrapping job.ErrBadInput for an empty reservedBy or a hold outside
// (0, MaxHold].
func (p *Pool) Reserve(ctx context.Context, reservedBy string, hold time.Duration) (Reservation, error) {
	if reservedBy == "" {
		return Reservation{}, job.BadInput("msisdnreaper: reserve: reservedBy is empty")
	}
	if hold <= 0 || hold > MaxHold {
		return Reservation{}, job.BadInput("msisdnreaper: reserve: hold %s outside (0, %s]", hold, MaxHold)
	}
	r := Reservation{ReservedBy: reservedBy, Token: newToken()}
	err := p.db.QueryRow(ctx, sqlReserve, reservedBy, hold.Microseconds(), r.Token).Scan(&r.MSISDN, &r.ReservedUntil)
	if errors.Is(err, pgx.ErrNoRows) {
		return Reservation{}, ErrPoolExhausted
	}
	if err != nil {
		return Reservation{}, fmt.Errorf("msisdnreaper: reserve: %w", err)
	}
	return r, nil
}

// newToken returns a reservation token: 128 random bits in hex.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// sqlAllocate moves RESERVED -> ALLOCATED only for the reservation's own
// token and while the hold is valid. The sweep's precondition is the
// complement (reserved_until < now()), and both lock the row, so an
// allocation and a sweep can never both win; the token keeps a caller whose
// reservation was swept from allocating the next caller's.
const sqlAllocate = `
update msisdn_pool
   set state = 'ALLOCATED',
       subscriber_id = $2,
       reserved_until = null,
       updated_at = now()
 where msisdn = $1
   and state = 'RESERVED'
   and reservation_token = $3
   and reserved_until >= now()`

// Allocate moves the reservation token holds to ALLOCATED for subscriberID,
// while its hold is valid. Allocating a number already allocated under the
// same token to the same subscriber succeeds (a retried call). A number
// reserved or allocated under another token gives a *TransitionError
// matching ErrNotReservationHolder (the caller's reservation ended and the
// number was reserved again); a passed hold ErrReservationExpired; any other
// state a *TransitionError; an unknown number ErrNotFound; an empty token an
// error wrapping job.ErrBadInput.
func (p *Pool) Allocate(ctx context.Context, msisdn, token string, subscriberID int64) error {
	if err := ValidateMSISDN(msisdn); err != nil {
		return err
	}
	if token == "" {
		return job.BadInput("msisdnreaper: allocate %s: reservation token is empty", msisdn)
	}
	tag, err := p.db.Exec(ctx, sqlAllocate, msisdn, subscriberID, token)
	if err != nil {
		return fmt.Errorf("msisdnreaper: allocate %s: %w", msisdn, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	cur, err := p.current(ctx, msisdn, token)
	if err != nil {
		return err
	}
	if cur.state == StateAllocated && cur.holder && cur.subscriberID != nil && *cur.subscriberID == subscriberID {
		return nil
	}
	notHolder := cur.state != StateFree && !cur.holder
	return &TransitionError{MSISDN: msisdn, From: cur.state, To: StateAllocated, NotHolder: notHolder,
		Expired: cur.state == StateReserved && !notHolder && !cur.valid}
}

const sqlRelease = `
update msisdn_pool
   set state = 'FREE',
       reserved_until = null,
       reserved_by = null,
       reservation_token = null,
       updated_at = now()
 where msisdn = $1
   and state = 'RESERVED'
   and reservation_token = $2`

// Release frees the reservation token holds, on purpose (expired or not). A
// number reserved under another token gives a *TransitionError matching
// ErrNotReservationHolder, one that is not RESERVED a *TransitionError, an
// unknown one ErrNotFound, an empty token an error wrapping job.ErrBadInput.
func (p *Pool) Release(ctx context.Context, msisdn, token string) error {
	if err := ValidateMSISDN(msisdn); err != nil {
		return err
	}
	if token == "" {
		return job.BadInput("msisdnreaper: release %s: reservation token is empty", msisdn)
	}
	tag, err := p.db.Exec(ctx, sqlRelease, msisdn, token)
	if err != nil {
		return fmt.Errorf("msisdnreaper: release %s: %w", msisdn, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	cur, err := p.current(ctx, msisdn, token)
	if err != nil {
		return err
	}
	return &TransitionError{MSISDN: msisdn, From: cur.state, To: StateFree, NotHolder: cur.state == StateReserved && !cur.holder}
}

// Number is one row as Get reports it.
type Number struct {
	MSISDN        string     `json:"msisdn"`
	State         State      `json:"state"`
	ReservedUntil *time.Time `json:"reserved_until,omitempty"`
	ReservedBy    *string    `json:"reserved_by,omitempty"`
	SubscriberID  *int64     `json:"subscriber_id,omitempty"`
}

// Get returns one number's row, or ErrNotFound.
func (p *Pool) Get(ctx context.Context, msisdn string) (Number, error) {
	n := Number{MSISDN: msisdn}
	err := p.db.QueryRow(ctx,
		`select state, reserved_until, reserved_by, subscriber_id from msisdn_pool where msisdn = $1`, msisdn).
		Scan(&n.State, &n.ReservedUntil, &n.ReservedBy, &n.SubscriberID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Number{}, fmt.Errorf("%w: %s", ErrNotFound, msisdn)
	}
	if err != nil {
		return Number{}, fmt.Errorf("msisdnreaper: get %s: %w", msisdn, err)
	}
	return n, nil
}

type current struct {
	state        State
	valid        bool
	holder       bool // the row's reservation token is the caller's
	subscriberID *int64
}

const sqlCurrent = `
select state, coalesce(reserved_until >= now(), false), coalesce(reservation_token = $2, false), subscriber_id
  from msisdn_pool where msisdn = $1`

// current explains a refused transition. It reads without a lock: the answer
// describes the row as it was just after the refusal.
func (p *Pool) current(ctx context.Context, msisdn, token string) (current, error) {
	var c current
	err := p.db.QueryRow(ctx, sqlCurrent, msisdn, token).
		Scan(&c.state, &c.valid, &c.holder, &c.subscriberID)
	if errors.Is(err, pgx.ErrNoRows) {
		return current{}, fmt.Errorf("%w: %s", ErrNotFound, msisdn)
	}
	if err != nil {
		return current{}, fmt.Errorf("msisdnreaper: read %s: %w", msisdn, err)
	}
	return c, nil
}

// ValidateMSISDN accepts 8 to 15 ASCII digits (E.164 without the '+'; a
// national format with a leading 0 is accepted too). Other input is an error
// wrapping job.ErrBadInput.
func ValidateMSISDN(s string) error {
	if len(s) < 8 || len(s) > 15 {
		return job.BadInput("msisdnreaper: msisdn %q must have 8 to 15 digits", s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return job.BadInput("msisdnreaper: msisdn %q has a non-digit at %d", s, i)
		}
	}
	return nil
}

// Numbers is a set of MSISDNs for Replenish: a Range or a List.
type Numbers struct {
	first, last string // a range, inclusive
	list        []string
}

// Range is every number from first to last inclusive. Both have the same
// number of digits (leading zeros are kept), first <= last, and the range
// holds at most MaxReplenish numbers.
func Range(first, last string) Numbers { return Numbers{first: first, last: last} }

// List is the given numbers.
func List(msisdns ...string) Numbers { return Numbers{list: msisdns} }

// MaxReplenish bounds one Replenish call.
const MaxReplenish = 10_000_000

func (n Numbers) validate() (size int64, err error) {
	if n.first == "" && n.last == "" {
		for _, m := range n.list {
			if err := ValidateMSISDN(m); err != nil {
				return 0, err
			}
		}
		return int64(len(n.list)), nil
	}
	if err := ValidateMSISDN(n.first); err != nil {
		return 0, err
	}
	if err := ValidateMSISDN(n.last); err != nil {
		return 0, err
	}
	if len(n.first) != len(n.last) {
		return 0, job.BadInput("msisdnreaper: range %s..%s: ends have different lengths", n.first, n.last)
	}
	a, _ := strconv.ParseInt(n.first, 10, 64)
	b, _ := strconv.ParseInt(n.last, 10, 64)
	if a > b {
		return 0, job.BadInput("msisdnreaper: range %s..%s: first is after last", n.first, n.last)
	}
	return b - a + 1, nil
}

// Replenished counts what Replenish did.
type Replenished struct {
	// Added is how many numbers were new.
	Added int64 `json:"added"`
	// Existing is how many were already in the pool (left as they were).
	Existing int64 `json:"existing"`
}

// The replenish statements report what they did: the distinct numbers
// offered and those inserted (the rest were in the pool already), so the
// counts are the database's.
const (
	sqlReplenishRange = `
with offered as (select lpad(($1::bigint + g)::text, $3::int, '0') as m from generate_series(0::bigint, $2::bigint - 1) g),
ins as (insert into msisdn_pool (msisdn) select m from offered on conflict (msisdn) do nothing returning 1)
select (select count(*) from offered), (select count(*) from ins)`
	sqlReplenishList = `
with offered as (select distinct m from unnest($1::text[]) m),
ins as (insert into msisdn_pool (msisdn) select m from offered on conflict (msisdn) do nothing returning 1)
select (select count(*) from offered), (select count(*) from ins)`
)

// Replenish adds numbers as FREE, in one transaction, while holding the lock
// ReplenishKey (watchdog lease). It is idempotent: numbers already in the pool
// are left as they are and counted as Existing (so is a number given twice
// in one call). Lock failures are the
// ownership errors (ErrAlreadyOwned, ErrUnavailable): nothing was added. Bad
// numbers wrap job.ErrBadInput and nothing is added.
func (p *Pool) Replenish(ctx context.Context, numbers ...Numbers) (Replenished, error) {
	var total int64
	for _, n := range numbers {
		size, err := n.validate()
		if err != nil {
			return Replenished{}, err
		}
		total += size
	}
	if total > MaxReplenish {
		return Replenished{}, job.BadInput("msisdnreaper: replenish of %d numbers exceeds %d per call", total, MaxReplenish)
	}
	var res Replenished
	err := ownership.WithLock(ctx, p.locker, ReplenishKey, 0, func(ctx context.Context) error {
		return pgx.BeginFunc(ctx, p.db, func(tx pgx.Tx) error {
			res = Replenished{}
			var offered int64
			for _, n := range numbers {
				var (
					o, added int64
					err      error
				)
				if n.list != nil {
					err = tx.QueryRow(ctx, sqlReplenishList, n.list).Scan(&o, &added)
				} else if n.first != "" {
					size, _ := n.validate()
					first, _ := strconv.ParseInt(n.first, 10, 64)
					err = tx.QueryRow(ctx, sqlReplenishRange, first, size, len(n.first)).Scan(&o, &added)
				}
				if err != nil {
					return fmt.Errorf("msisdnreaper: replenish: %w", err)
				}
				offered += o
				res.Added += added
			}
			res.Existing = offered - res.Added
			return nil
		})
	})
	if err != nil {
		return Replenished{}, err
	}
	return res, nil
}

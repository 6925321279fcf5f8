package msisdnreaper

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SeedSpec says how many numbers of each kind Seed creates.
type SeedSpec struct {
	Free          int
	StaleReserved int // RESERVED, reserved_until 1 s to 1 day in the past
	ValidReserved int // RESERVED, reserved_until 1 h to 1 day ahead
	Allocated     int
	// First is the lowest number. Default 447700000000 (12 digits).
	First int64
}

// Total is the number of rows the spec creates.
func (s SeedSpec) Total() int64 {
	return int64(s.Free) + int64(s.StaleReserved) + int64(s.ValidReserved) + int64(s.Allocated)
}

// DefaultSeedFirst is SeedSpec.First's default.
const DefaultSeedFirst int64 = 447700000000

// sqlSeed inserts $2 consecutive numbers from $1 in one statement. Row i's
// kind comes from slot = i*$6 mod $2 ($6 coprime with $2, so every slot is
// used once): slots [0, stale) are stale holds, then valid holds, allocated,
// free. The kinds, and the stale holds' expiry times, are scattered over the
// table's pages as they would be in a pool that has lived a while.
const sqlSeed = `
insert into msisdn_pool (msisdn, state, reserved_until, reserved_by, subscriber_id)
select ($1::bigint + i)::text,
       case when slot < $3 then 'RESERVED'
            when slot < $3 + $4 then 'RESERVED'
            when slot < $3 + $4 + $5 then 'ALLOCATED'
            else 'FREE' end,
       case when slot < $3 then now() - (1 + (i * 7919) % 86400) * interval '1 second'
            when slot < $3 + $4 then now() + (3600 + (i * 7919) % 86400) * interval '1 second'
            end,
       case when slot < $3 + $4 then 'seed' end,
       case when slot >= $3 + $4 and slot < $3 + $4 + $5 then 1000000 + i end
  from (select i, (i * $6::bigint) % $2::bigint as slot from generate_series(0::bigint, $2::bigint - 1) i) g
on conflict (msisdn) do nothing`

// Seed fills the pool for demos, tests and benchmarks with one set-based
// statement, then ANALYZEs the table so the planner sees the new shape. It
// returns how many rows were inserted (numbers already present are left as
// they are).
func Seed(ctx context.Context, db *pgxpool.Pool, spec SeedSpec) (int64, error) {
	n := spec.Total()
	if spec.Free < 0 || spec.StaleReserved < 0 || spec.ValidReserved < 0 || spec.Allocated < 0 {
		return 0, fmt.Errorf("msisdnreaper: seed: negative count in %+v", spec)
	}
	if n == 0 {
		return 0, nil
	}
	first := spec.First
	if first == 0 {
		first = DefaultSeedFirst
	}
	tag, err := db.Exec(ctx, sqlSeed, first, n, spec.StaleReserved, spec.ValidReserved, spec.Allocated, stride(n))
	if err != nil {
		return 0, fmt.Errorf("msisdnreaper: seed: %w", err)
	}
	if _, err := db.Exec(ctx, "analyze msisdn_pool"); err != nil {
		return 0, fmt.Errorf("msisdnreaper: seed: analyze: %w", err)
	}
	return tag.RowsAffected(), nil
}

// stride returns a multiplier coprime with n (so i -> i*stride mod n is a
// permutation) that spreads neighbours far apart.
func stride(n int64) int64 {
	for _, p := range []int64{1_000_003, 999_983, 7_919, 104_729, 1_299_709} {
		if gcd(p%n, n) == 1 || n == 1 {
			return p
		}
	}
	return 1 // unreachable for any n below the product of the primes
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

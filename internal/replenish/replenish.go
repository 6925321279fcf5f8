// Package replenish is MSISDN pool replenishment as a kind of owned run:
// new numbers are added to msisdn_pool as FREE while this replica holds the
// lock msisdn-pool:replenish, so that two replenishments take turns instead
// of interleaving. It is triggered like every kind: Kafka
// (subscription.msisdn-pool.replenish-requested), HTTP (POST
// /v1/msisdn-pool/replenishments, synchronous) and the CLI (`coordinator
// run replenish`, `coordinator trigger replenish`).
//
// A trigger names a range or a list:
//
//	{"first":"447700000000","count":1000}      447700000000..447700000999
//	{"msisdns":["447700000001","447700000002"]}
//
// The work is msisdnreaper.Pool.Replenish: one transaction, idempotent
// (numbers already in the pool are left as they are and counted as
// existing), taking the same lock reentrantly under the run's lease.
//
// # What happens on failure
//
//   - A bad trigger (neither or both forms, a malformed number, a count
//     outside 1..10,000,000, a range that changes digit count): rejected
//     with a reason (Kafka: dead-lettered; HTTP 400; CLI exit 64); nothing
//     runs.
//   - Another replica replenishes: already_owned naming it (HTTP 409, exit
//     75); a Kafka trigger is committed, and can be sent again.
//   - Lock backend down: unavailable (HTTP 503, exit 69); a Kafka trigger
//     is retried.
//   - The lease is lost or the replica shuts down mid-insert: the
//     transaction rolls back, nothing is added, outcome lost (exit 76); a
//     Kafka trigger is redelivered and, being idempotent, simply runs again.
//   - Postgres fails: outcome failed (HTTP 500, exit 1), nothing is added.
package replenish

import (
	"context"
	"flag"
	"fmt"
	"strconv"

	"github.com/telco-platform/coordinator/internal/base10"
	"github.com/telco-platform/coordinator/internal/msisdnreaper"
	"github.com/telco-platform/coordinator/internal/owned"
)

const (
	// Name is the kind's name: the job in results, events and metrics, and
	// the namespace of its lock key.
	Name = "msisdn-pool"
	// Key is the one lock every replenishment holds.
	Key = msisdnreaper.ReplenishKey
	// Topic is the Kafka trigger topic.
	Topic = "subscription.msisdn-pool.replenish-requested"
)

// Reasons a replenishment trigger is rejected (besides owned's shared ones).
const (
	ReasonMissingNumbers     = "missing_numbers"     // neither a range nor a list
	ReasonConflictingNumbers = "conflicting_numbers" // both a range and a list
	ReasonBadMSISDN          = "bad_msisdn"          // not 8 to 15 digits
	ReasonBadCount           = "bad_count"           // count missing or outside 1..MaxReplenish
	ReasonBadRange           = "bad_range"           // first+count-1 has more digits than first
)

// Params are the numbers to add: a range (First, Count) or a list.
type Params struct {
	First   string   `json:"first,omitempty"`
	Count   int64    `json:"count,omitempty"`
	MSISDNs []string `json:"msisdns,omitempty"`
}

// New returns the replenishment kind: `coordinator run replenish`, its
// topic, POST /v1/msisdn-pool/replenishments. It has no settings.
func New() owned.Kind {
	return owned.Define(owned.Def[Params]{
		Spec: owned.Spec{Name: Name, Command: "replenish", Summary: "add numbers to the MSISDN pool as FREE (idempotent)",
			Usage: "--first N --count K | MSISDN...", Topic: Topic, HTTPPath: "/v1/msisdn-pool/replenishments"},
		Decode:        decode,
		RejectReasons: []string{ReasonMissingNumbers, ReasonConflictingNumbers, ReasonBadMSISDN, ReasonBadCount, ReasonBadRange},
		// The record has no key: one lock for every replenishment.
		Encode: func(p Params) ([]byte, map[string]any) {
			if p.MSISDNs != nil {
				return nil, map[string]any{"msisdns": p.MSISDNs}
			}
			return nil, map[string]any{"first": p.First, "count": p.Count}
		},
		Flags: flags,
		// msisdn-pool:replenish, whatever the numbers.
		LockKey: func(Params) string { return Key },
		// Every record asks for the one lock.
		RecordLockKey: func([]byte) (string, bool) { return Key, true },
		// The Worker adds on the deployment's pool and Locker.
		Open: func(d owned.Deps) (owned.Worker[Params], error) {
			w := worker{pool: msisdnreaper.NewPool(d.DB, d.Locker)}
			return owned.Worker[Params]{Run: w.run}, nil
		},
	})
}

// decode reads {"first":"...","count":K} or {"msisdns":[...]}, from every
// source (the CLI's flags and arguments are these fields).
func decode(in owned.Input) (Params, error) {
	var w struct {
		First   *string  `json:"first"`
		Count   *int64   `json:"count"`
		MSISDNs []string `json:"msisdns"`
	}
	if err := in.Decode(&w); err != nil {
		return Params{}, err
	}
	ranged := w.First != nil || w.Count != nil
	switch {
	case ranged && in.Has("msisdns"):
		return Params{}, owned.Reject(ReasonConflictingNumbers, "give either first and count (--first, --count) or msisdns (the CLI's arguments), not both")
	case ranged:
		if w.First == nil {
			return Params{}, owned.Reject(ReasonMissingNumbers, "count needs first (the first number of the range)")
		}
		if w.Count == nil {
			return Params{}, owned.Reject(ReasonBadCount, "first needs count (how many numbers, 1..%d)", msisdnreaper.MaxReplenish)
		}
		return checkRange(*w.First, *w.Count)
	case len(w.MSISDNs) > 0:
		return checkList(w.MSISDNs)
	}
	return Params{}, owned.Reject(ReasonMissingNumbers, `want {"first":"447700000000","count":1000} or {"msisdns":["447700000001",...]}`)
}

func checkRange(first string, count int64) (Params, error) {
	if err := msisdnreaper.ValidateMSISDN(first); err != nil {
		return Params{}, owned.Reject(ReasonBadMSISDN, "first: %s", owned.RejectionOf(err).Detail)
	}
	if count < 1 || count > msisdnreaper.MaxReplenish {
		return Params{}, owned.Reject(ReasonBadCount, "count = %d: must be 1..%d", count, msisdnreaper.MaxReplenish)
	}
	if _, err := last(first, count); err != nil {
		return Params{}, err
	}
	return Params{First: first, Count: count}, nil
}

func checkList(msisdns []string) (Params, error) {
	if len(msisdns) > msisdnreaper.MaxReplenish {
		return Params{}, owned.Reject(ReasonBadCount, "%d numbers: at most %d per run", len(msisdns), msisdnreaper.MaxReplenish)
	}
	for i, m := range msisdns {
		if err := msisdnreaper.ValidateMSISDN(m); err != nil {
			return Params{}, owned.Reject(ReasonBadMSISDN, "msisdns[%d]: %s", i, owned.RejectionOf(err).Detail)
		}
	}
	return Params{MSISDNs: msisdns}, nil
}

// last is the range's last number, with first's digit count (leading zeros
// kept).
func last(first string, count int64) (string, error) {
	n, _ := strconv.ParseInt(first, 10, 64) // ValidateMSISDN: at most 15 digits
	l := fmt.Sprintf("%0*d", len(first), n+count-1)
	if len(l) != len(first) {
		return "", owned.Reject(ReasonBadRange, "%s + %d numbers ends at %s: the range must keep %d digits", first, count, l, len(first))
	}
	return l, nil
}

// flags: --first and --count, or the numbers as arguments, as the
// trigger's fields (decode judges them).
func flags(fs *flag.FlagSet) func([]string) (map[string]any, error) {
	first := fs.String("first", "", "first number of the range (8 to 15 digits; leading zeros are kept)")
	count := base10.Int64(fs, "count", 0, "how many numbers from --first on")
	return func(args []string) (map[string]any, error) {
		fields := map[string]any{}
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if set["first"] {
			fields["first"] = *first
		}
		if set["count"] {
			fields["count"] = *count
		}
		if len(args) > 0 {
			fields["msisdns"] = args
		}
		return fields, nil
	}
}

type worker struct {
	pool *msisdnreaper.Pool
}

// run adds the numbers in one transaction. Counts: added (new numbers),
// existing (already in the pool, left as they were), offered (their sum).
func (w worker) run(ctx context.Context, run *owned.Run, p Params) (owned.Report, error) {
	numbers := msisdnreaper.List(p.MSISDNs...)
	if p.MSISDNs == nil {
		l, err := last(p.First, p.Count)
		if err != nil {
			return owned.Report{}, err
		}
		numbers = msisdnreaper.Range(p.First, l)
	}
	// One transaction: one batch of progress, its rows every number offered.
	run.SetTotal(1)
	// Replenish takes Key itself; under the run's context that is the
	// template's lease, so it re-enters instead of waiting for itself.
	res, err := w.pool.Replenish(ctx, numbers)
	if err != nil {
		return owned.Report{}, err
	}
	run.Committed(1, res.Added+res.Existing)
	run.Log().Info("replenish_added", "added", res.Added, "existing", res.Existing)
	return owned.Report{Counts: map[string]int64{
		"added": res.Added, "existing": res.Existing, "offered": res.Added + res.Existing,
	}}, nil
}

// Package consoledb keeps the console's tables in the shared PostgreSQL
// (migrations 00018 and 00019): the run history the template writes at each
// run's outcome (HistoryWriter), the events of the events topic indexed by
// one consumer group (Indexer), one heartbeat row per replica (Heartbeat),
// the console's sessions, and their retention (Janitor). Store reads them
// for the console (console.Store, console.Sessions).
//
// Nothing here is on a run's path: the history writer takes records into a
// bounded buffer and writes them in the background (dropping and counting
// when Postgres stays away longer than the buffer lasts); the indexer and
// the heartbeat are goroutines of their own.
package consoledb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/telco-platform/coordinator/internal/console"
)

// Store reads the console's tables (and run_requests).
type Store struct {
	pool *pgxpool.Pool
}

// NewStore returns a Store on pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

var (
	_ console.Store    = (*Store)(nil)
	_ console.Sessions = (*Store)(nil)
)

// MaxPage bounds a page of runs.
const MaxPage = 200

// sqlRuns is a page of a kind's history, newest first: keyset pagination
// on the primary key (ids below $3 when it is not 0), so a page costs the
// same at any depth. $2 ” is every key.
const sqlRuns = `
select id, job, run_key, outcome, replica, coalesce(fence, 0), coalesce(lock_fence, 0),
       coalesce(trigger_source, ''), coalesce(request_id, ''), coalesce(requested_by, ''), coalesce(principal, ''),
       started_at, ended_at, counts, coalesce(error, ''), timeline
from run_history
where job = $1 and ($2 = '' or run_key = $2) and ($3 = 0 or id < $3)
order by id desc
limit $4`

// Failures implements console.Store.
func (s *Store) Failures(ctx context.Context, since time.Time, limit int) ([]console.Run, error) {
	return s.runs(ctx, sqlFailures, since, max(limit, 1))
}

const sqlFailures = `
select id, job, run_key, outcome, replica, coalesce(fence, 0), coalesce(lock_fence, 0),
       coalesce(trigger_source, ''), coalesce(request_id, ''), coalesce(requested_by, ''), coalesce(principal, ''),
       started_at, ended_at, counts, coalesce(error, ''), timeline
from run_history
where ended_at >= $1 and outcome in ('failed', 'lost')
order by ended_at desc
limit $2`

// Runs implements console.Store.
func (s *Store) Runs(ctx context.Context, job string, q console.RunQuery) ([]console.Run, error) {
	return s.runs(ctx, sqlRuns, job, q.Key, q.Before, min(max(q.Limit, 1), MaxPage))
}

func (s *Store) runs(ctx context.Context, sql string, args ...any) ([]console.Run, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("consoledb: runs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (console.Run, error) {
		var r console.Run
		var counts, timeline []byte
		err := row.Scan(&r.ID, &r.Job, &r.Key, &r.Outcome, &r.Replica, &r.Fence, &r.LockFence, &r.Trigger,
			&r.RequestID, &r.RequestedBy, &r.Principal, &r.Started, &r.Ended, &counts, &r.Error, &timeline)
		if err != nil {
			return r, err
		}
		if err := json.Unmarshal(counts, &r.Counts); err != nil {
			return r, fmt.Errorf("counts of run %d: %w", r.ID, err)
		}
		r.Timeline, err = decodeTimeline(timeline)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("consoledb: runs: %w", err)
	}
	return out, nil
}

// decodeTimeline reads [[ms, batches, rows], ...].
func decodeTimeline(b []byte) ([]console.Point, error) {
	var raw [][3]int64
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("timeline: %w", err)
	}
	out := make([]console.Point, len(raw))
	for i, p := range raw {
		out[i] = console.Point{At: time.Duration(p[0]) * time.Millisecond, Batches: p[1], Rows: p[2]}
	}
	return out, nil
}

// sqlEvents is a lock key's events in Kafka's order. The newest $2 when
// there are more (a key like msisdn-reaper:sweep collects thousands), given
// back oldest first.
const sqlEvents = `
select id, topic_partition, topic_offset, type, run_key, coalesce(job, ''), coalesce(replica, ''), event_time,
       coalesce(reason, ''), data
from (select * from ownership_events where run_key = $1
      order by topic_partition desc, topic_offset desc limit $2) e
order by topic_partition, topic_offset`

// sqlRecentEvents are the newest events.
const sqlRecentEvents = `
select id, topic_partition, topic_offset, type, run_key, coalesce(job, ''), coalesce(replica, ''), event_time,
       coalesce(reason, ''), data
from ownership_events
order by event_time desc
limit $1`

// sqlRecentEventsOfPrefix are the newest events of keys in [$1, $2): the keys
// starting with a prefix, as a byte-order range that the index
// ownership_events_key_prefix (00020) answers.
const sqlRecentEventsOfPrefix = `
select id, topic_partition, topic_offset, type, run_key, coalesce(job, ''), coalesce(replica, ''), event_time,
       coalesce(reason, ''), data
from ownership_events
where run_key collate "C" >= $1 and ($2 = '' or run_key collate "C" < $2)
order by event_time desc
limit $3`

// RecentEvents implements console.Store.
func (s *Store) RecentEvents(ctx context.Context, prefix string, limit int) ([]console.Event, error) {
	if prefix == "" {
		return s.events(ctx, sqlRecentEvents, max(limit, 1))
	}
	return s.events(ctx, sqlRecentEventsOfPrefix, prefix, prefixEnd(prefix), max(limit, 1))
}

// prefixEnd is the least string above every string that starts with prefix,
// in byte (and so code point) order: prefix with its last character
// incremented. Empty when there is none (a prefix of U+10FFFF only): no bound.
func prefixEnd(prefix string) string {
	r := []rune(prefix)
	for i := len(r) - 1; i >= 0; i-- {
		if r[i] < utf8.MaxRune {
			r[i]++
			if r[i] >= 0xD800 && r[i] <= 0xDFFF { // surrogates are not characters
				r[i] = 0xE000
			}
			return string(r[:i+1])
		}
	}
	return ""
}

// Events implements console.Store.
func (s *Store) Events(ctx context.Context, key string, limit int) ([]console.Event, error) {
	return s.events(ctx, sqlEvents, key, max(limit, 1))
}

func (s *Store) events(ctx context.Context, sql string, args ...any) ([]console.Event, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("consoledb: events: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (console.Event, error) {
		var e console.Event
		var data []byte
		if err := row.Scan(&e.ID, &e.Partition, &e.Offset, &e.Type, &e.Key, &e.Job, &e.Replica, &e.Time, &e.Reason, &data); err != nil {
			return e, err
		}
		return e, json.Unmarshal(data, &e.Data)
	})
	if err != nil {
		return nil, fmt.Errorf("consoledb: events: %w", err)
	}
	return out, nil
}

// sqlReplicas are the heartbeats, with their age by the database's clock
// (replicas' clocks may disagree; the database's is the one they share).
const sqlReplicas = `
select replica, version, started_at, extract(epoch from now() - seen_at)::float8, stopped_at is not null,
       ready, dependencies, runs
from replica_heartbeats
order by replica`

// Replicas implements console.Store.
func (s *Store) Replicas(ctx context.Context) ([]console.Replica, error) {
	rows, err := s.pool.Query(ctx, sqlReplicas)
	if err != nil {
		return nil, fmt.Errorf("consoledb: replicas: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (console.Replica, error) {
		var r console.Replica
		var age float64
		var deps, runs []byte
		if err := row.Scan(&r.ID, &r.Version, &r.Started, &age, &r.Stopped, &r.Ready, &deps, &runs); err != nil {
			return r, err
		}
		r.Age = time.Duration(age * float64(time.Second))
		if err := json.Unmarshal(deps, &r.Dependencies); err != nil {
			return r, fmt.Errorf("dependencies of %s: %w", r.ID, err)
		}
		return r, json.Unmarshal(runs, &r.Runs)
	})
	if err != nil {
		return nil, fmt.Errorf("consoledb: replicas: %w", err)
	}
	return out, nil
}

// sqlPending are the requests the resumer owes a completed run, permanent
// ones first, then by age.
const sqlPending = `
select job, run_key, coalesce(last_outcome, ''), coalesce(last_error, ''), attempts, permanent,
       accepted_at, next_attempt_at, coalesce(trigger_source, ''), coalesce(requested_by, '')
from run_requests
order by permanent desc, accepted_at
limit 500`

// Pending implements console.Store.
func (s *Store) Pending(ctx context.Context) ([]console.Pending, error) {
	rows, err := s.pool.Query(ctx, sqlPending)
	if err != nil {
		return nil, fmt.Errorf("consoledb: pending: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (console.Pending, error) {
		var p console.Pending
		err := row.Scan(&p.Job, &p.Key, &p.Outcome, &p.Error, &p.Attempts, &p.Permanent, &p.AcceptedAt,
			&p.NextAttempt, &p.Source, &p.RequestedBy)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("consoledb: pending: %w", err)
	}
	return out, nil
}

const sqlDeadLetters = `
select coalesce(reason, 'unknown'), count(*)
from ownership_events
where type = 'trigger.rejected' and event_time >= $1
group by 1
order by 2 desc, 1`

// DeadLetters implements console.Store.
func (s *Store) DeadLetters(ctx context.Context, since time.Time) ([]console.DeadLetters, error) {
	rows, err := s.pool.Query(ctx, sqlDeadLetters, since)
	if err != nil {
		return nil, fmt.Errorf("consoledb: dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (console.DeadLetters, error) {
		var d console.DeadLetters
		err := row.Scan(&d.Reason, &d.Count)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("consoledb: dead letters: %w", err)
	}
	return out, nil
}

// CreateSession implements console.Sessions.
func (s *Store) CreateSession(ctx context.Context, se console.Session) error {
	_, err := s.pool.Exec(ctx, `insert into console_sessions (id_hash, principal, scopes, csrf, expires_at) values ($1, $2, $3, $4, $5)`,
		se.IDHash, se.Principal, scopesText(se), se.CSRF, se.Expires)
	if err != nil {
		return fmt.Errorf("consoledb: create session: %w", err)
	}
	return nil
}

// LookupSession implements console.Sessions: an expired session is no
// session (the janitor deletes it later).
func (s *Store) LookupSession(ctx context.Context, idHash []byte) (console.Session, bool, error) {
	se := console.Session{IDHash: idHash}
	var scopes string
	err := s.pool.QueryRow(ctx, `select principal, scopes, csrf, expires_at from console_sessions where id_hash = $1 and expires_at > now()`,
		idHash).Scan(&se.Principal, &scopes, &se.CSRF, &se.Expires)
	if errors.Is(err, pgx.ErrNoRows) {
		return console.Session{}, false, nil
	}
	if err != nil {
		return console.Session{}, false, fmt.Errorf("consoledb: look up session: %w", err)
	}
	se.Read, se.Mutate = hasScope(scopes, "read"), hasScope(scopes, "mutate")
	return se, true, nil
}

// DeleteSession implements console.Sessions.
func (s *Store) DeleteSession(ctx context.Context, idHash []byte) error {
	if _, err := s.pool.Exec(ctx, `delete from console_sessions where id_hash = $1`, idHash); err != nil {
		return fmt.Errorf("consoledb: delete session: %w", err)
	}
	return nil
}

func scopesText(s console.Session) string {
	switch {
	case s.Read && s.Mutate:
		return "read,mutate"
	case s.Mutate:
		return "mutate"
	case s.Read:
		return "read"
	}
	return ""
}

func hasScope(list, scope string) bool { return slices.Contains(strings.Split(list, ","), scope) }

package postgres

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DisposableMark begins the database comment that marks a database as
// disposable: a test or demo database that `coordinator seed`, `migrate
// down` and `demo` may empty or drop without --force. Only the database's
// owner (or a superuser) can set a comment, so the DML-only role a
// production replica runs as cannot mark its own database.
//
//	COMMENT ON DATABASE coordinator_test IS 'coordinator:disposable (CI)';
const DisposableMark = "coordinator:disposable"

// NotDisposableError refuses a destructive command on a database without
// the mark.
type NotDisposableError struct {
	Database string
	Command  string // "seed", "migrate down"
}

func (e *NotDisposableError) Error() string {
	return fmt.Sprintf("postgres: database %q is not marked disposable, and %s would change its data or drop its tables: "+
		"run it against a test database (COMMENT ON DATABASE %s IS '%s ...' marks one), or pass --force",
		e.Database, e.Command, pgx.Identifier{e.Database}.Sanitize(), DisposableMark)
}

// Disposable reports whether the database pool is connected to carries
// DisposableMark, and its name.
func Disposable(ctx context.Context, pool *pgxpool.Pool) (bool, string, error) {
	var name string
	var comment *string
	err := pool.QueryRow(ctx, `select current_database(), shobj_description(oid, 'pg_database')
		from pg_database where datname = current_database()`).Scan(&name, &comment)
	if err != nil {
		return false, "", fmt.Errorf("postgres: read the database comment: %w", err)
	}
	return comment != nil && strings.HasPrefix(*comment, DisposableMark), name, nil
}

const sqlMarkDisposable = `do $$ begin
	execute format('comment on database %I is %L', current_database(), current_setting('coordinator.disposable_mark'));
end $$`

// RequireDisposable returns a *NotDisposableError unless the database is
// marked disposable or force is set.
func RequireDisposable(ctx context.Context, pool *pgxpool.Pool, command string, force bool) error {
	ok, name, err := Disposable(ctx, pool)
	if err != nil {
		return err
	}
	if !ok && !force {
		return &NotDisposableError{Database: name, Command: command}
	}
	return nil
}

// MarkDisposable sets DisposableMark (followed by note) as the comment of
// the database pool is connected to, unless it is already marked. It needs
// the database's owner or a superuser; concurrent callers are serialised.
func MarkDisposable(ctx context.Context, pool *pgxpool.Pool, note string) error {
	if ok, _, err := Disposable(ctx, pool); err != nil || ok {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// One marker at a time: testenv marks from many test processes at
		// once, and catalog updates of one row from two sessions can fail.
		if _, err := tx.Exec(ctx, `select pg_advisory_xact_lock(hashtext('coordinator:mark-disposable'))`); err != nil {
			return err
		}
		// COMMENT takes no bind parameters: hand the text over in a
		// transaction-local setting and let format() quote it.
		if _, err := tx.Exec(ctx, `select set_config('coordinator.disposable_mark', $1, true)`, DisposableMark+" ("+note+")"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlMarkDisposable); err != nil {
			return fmt.Errorf("postgres: mark the database disposable: %w", err)
		}
		return nil
	})
}

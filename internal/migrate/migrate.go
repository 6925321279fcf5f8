// Package migrate applies the embedded SQL migrations with goose's Provider
// API: no package globals, a session lock so two replicas migrating at once
// take turns, and the version table in the connection's search_path (so a
// test schema carries its own).
package migrate

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/telco-platform/coordinator/migrations"
)

// Migrator applies and reverses the embedded migrations on one database.
type Migrator struct {
	db       *sql.DB
	provider *goose.Provider
}

// Option configures New.
type Option func(*[]lock.SessionLockerOption)

// WithLockID makes the Migrator take advisory lock id while it migrates,
// instead of goose's default, which is one lock for the whole database (so
// migrations of different schemas wait for each other, 5s at a time). Tests
// that migrate a schema each, many at once, give each schema its own.
func WithLockID(id int64) Option {
	return func(o *[]lock.SessionLockerOption) { *o = append(*o, lock.WithLockID(id)) }
}

// New wraps pool. Close the Migrator when done; the pool stays open.
func New(pool *pgxpool.Pool, opts ...Option) (*Migrator, error) {
	var lockOpts []lock.SessionLockerOption
	for _, o := range opts {
		o(&lockOpts)
	}
	db := stdlib.OpenDBFromPool(pool)
	locker, err := lock.NewPostgresSessionLocker(lockOpts...)
	if err != nil {
		return nil, fmt.Errorf("migrate: session locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS, goose.WithSessionLocker(locker))
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return &Migrator{db: db, provider: p}, nil
}

// Close releases the database/sql handle (not the pool).
func (m *Migrator) Close() error { return m.db.Close() }

// Applied is one migration that ran (or was rolled back).
type Applied struct {
	Version int64
	Name    string
	Took    string
}

// Up applies every pending migration; with none pending it does nothing.
func (m *Migrator) Up(ctx context.Context) ([]Applied, error) {
	res, err := m.provider.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate up: %w", err)
	}
	return applied(res), nil
}

// UpTo applies the pending migrations up to and including version (tests
// that need rows written before a later migration).
func (m *Migrator) UpTo(ctx context.Context, version int64) ([]Applied, error) {
	res, err := m.provider.UpTo(ctx, version)
	if err != nil {
		return nil, fmt.Errorf("migrate up to %d: %w", version, err)
	}
	return applied(res), nil
}

// DownAll reverses every applied migration, newest first.
func (m *Migrator) DownAll(ctx context.Context) ([]Applied, error) {
	res, err := m.provider.DownTo(ctx, 0)
	if err != nil {
		return nil, fmt.Errorf("migrate down: %w", err)
	}
	return applied(res), nil
}

// Status is one migration's state.
type Status struct {
	Version int64
	Name    string
	Applied bool
	At      string
}

// Status lists every known migration and whether it is applied.
func (m *Migrator) Status(ctx context.Context) ([]Status, error) {
	st, err := m.provider.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate status: %w", err)
	}
	out := make([]Status, 0, len(st))
	for _, s := range st {
		row := Status{Version: s.Source.Version, Name: baseName(s.Source.Path), Applied: s.State == goose.StateApplied}
		if row.Applied {
			row.At = s.AppliedAt.UTC().Format("2006-01-02T15:04:05Z")
		}
		out = append(out, row)
	}
	return out, nil
}

// Pending reports how many migrations are not applied (readiness and
// start-up use it). It reads the version table without goose's migration
// lock, so it answers at once while a migration runs, here or in any other
// schema of the database (the lock is one advisory lock per database).
// Migrations apply in order, so those above the newest applied version are
// the pending ones.
func (m *Migrator) Pending(ctx context.Context) (int, error) {
	current, _, err := m.provider.GetVersions(ctx)
	if err != nil {
		return 0, fmt.Errorf("migrate pending: %w", err)
	}
	n := 0
	for _, s := range m.provider.ListSources() {
		if s.Version > current {
			n++
		}
	}
	return n, nil
}

func applied(res []*goose.MigrationResult) []Applied {
	out := make([]Applied, 0, len(res))
	for _, r := range res {
		out = append(out, Applied{Version: r.Source.Version, Name: baseName(r.Source.Path), Took: r.Duration.String()})
	}
	return out
}

func baseName(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[i+1:]
		}
	}
	return p
}

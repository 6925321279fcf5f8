// Package postgres opens the pgx pool every component shares and names the
// Postgres errors the jobs must tell apart (unique violations, serialization
// failures, lost connections).
package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Option tunes Connect.
type Option func(*pgxpool.Config)

// WithTracer traces every query of the pool (otelpgx); nil: untraced.
func WithTracer(t pgx.QueryTracer) Option {
	return func(c *pgxpool.Config) {
		if t != nil {
			c.ConnConfig.Tracer = t
		}
	}
}

// Connect opens a pool on dsn and checks it answers within the ctx bound.
// maxConns 0 keeps pgx's default (max(4, NumCPU)).
func Connect(ctx context.Context, dsn string, maxConns int32, opts ...Option) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse DSN: %w", redactParseError(err))
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	for _, o := range opts {
		o(cfg)
	}
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "coordinator"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %s:%d unreachable: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	return pool, nil
}

// SQLSTATE codes the jobs act on.
const (
	CodeUniqueViolation      = "23505"
	CodeSerializationFailure = "40001"
	CodeDeadlockDetected     = "40P01"
)

// Code returns the SQLSTATE of err, or "" when err is not a server error.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// IsUniqueViolation reports a 23505 anywhere in err's chain.
func IsUniqueViolation(err error) bool { return Code(err) == CodeUniqueViolation }

// ConstraintName returns the violated constraint, when err carries one.
func ConstraintName(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.ConstraintName
	}
	return ""
}

// IsTransient reports errors worth retrying: lost connections, admin
// shutdowns, serialization failures and deadlocks. Constraint violations and
// syntax errors are not.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, pgx.ErrNoRows) || errors.Is(err, pgx.ErrTooManyRows) {
		// An answer, not a fault: asking again repeats it.
		return false
	}
	switch c := Code(err); {
	case c == CodeSerializationFailure, c == CodeDeadlockDetected:
		return true
	case len(c) == 5 && (c[:2] == "08" || c[:2] == "57" || c[:2] == "53"):
		// connection exception, operator intervention (admin shutdown), insufficient resources
		return true
	case c != "":
		return false
	}
	// No SQLSTATE: a network or pool error (the server went away).
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

func redactParseError(err error) error {
	// pgconn's parse errors can echo the DSN; keep only the kind of failure.
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		return errors.New("invalid connection string")
	}
	return err
}

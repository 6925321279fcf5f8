package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/postgres"
)

// A query that found no row is an answer, not a fault: retrying it only
// repeats the answer (a bill run's claim of a COMPLETED period retried it
// with backoff for 3 s before saying already_completed).
func TestIsTransient(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"no rows", pgx.ErrNoRows, false},
		{"no rows, wrapped", fmt.Errorf("billrun: claim: %w", pgx.ErrNoRows), false},
		{"too many rows", pgx.ErrTooManyRows, false},
		{"canceled", context.Canceled, false},
		{"deadline", context.DeadlineExceeded, false},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"serialization failure", &pgconn.PgError{Code: postgres.CodeSerializationFailure}, true},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"connection exception", &pgconn.PgError{Code: "08006"}, true},
		{"network", errors.New("dial tcp 127.0.0.1:5432: connect: connection refused"), true},
	} {
		require.Equal(t, c.want, postgres.IsTransient(c.err), c.name)
	}
}

package owned_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// Failures are transient (the resumer tries again) or permanent (it pages).
func TestIsRetryable(t *testing.T) {
	t.Parallel()
	// A real refused connection: nothing listens on a port just freed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	_, refused := net.DialTimeout("tcp", addr, time.Second)
	require.Error(t, refused)

	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"connection refused", fmt.Errorf("billrun: claim: %w", refused), true},
		{"serialization failure", &pgconn.PgError{Code: "40001"}, true},
		{"deadlock", &pgconn.PgError{Code: "40P01"}, true},
		{"admin shutdown", fmt.Errorf("batch: %w", &pgconn.PgError{Code: "57P01"}), true},
		{"statement timeout", &pgconn.PgError{Code: "57014"}, true},
		{"lock timeout", &pgconn.PgError{Code: "55P03"}, true},
		{"connection failure", &pgconn.PgError{Code: "08006"}, true},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"undefined column", &pgconn.PgError{Code: "42703"}, false},
		{"deadline", fmt.Errorf("finish: %w", context.DeadlineExceeded), true},
		{"lock backend unavailable", fmt.Errorf("x: %w", ownership.ErrUnavailable), true},
		{"marked by the kind", owned.Retryable(errors.New("lost connection")), true},
		{"a bug", errors.New("index out of range"), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, c.want, owned.IsRetryable(c.err), "%v", c.err)
		})
	}
	require.Nil(t, owned.Retryable(nil))
}

package owned

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/telco-platform/coordinator/internal/ownership"
)

// retryableError marks an error whose cause is transient: trying the run
// again may complete it.
type retryableError struct{ err error }

func (e *retryableError) Error() string { return e.err.Error() }
func (e *retryableError) Unwrap() error { return e.err }

// Retryable marks err as transient (a kind that knows its store's errors
// says so at its boundary: billrun marks Postgres' transient errors). Nil
// stays nil.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return &retryableError{err: err}
}

// IsRetryable classifies a run's failure: true for a transient cause
// (marked Retryable by the kind; the lock backend unavailable; a Postgres
// SQLSTATE of class 08 connection, 57 operator intervention such as admin
// shutdown or a cancelled statement, 53 insufficient resources,
// serialization failure 40001, deadlock 40P01, lock timeout 55P03; a
// connection refused, reset or broken; an unexpected EOF; a timeout), false
// for anything else, which is permanent: trying again would fail the same
// way (a constraint, a bug, bad data).
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	var re *retryableError
	if errors.As(err, &re) || errors.Is(err, ownership.ErrUnavailable) {
		return true
	}
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		switch c := st.SQLState(); {
		case c == "40001", c == "40P01", c == "55P03":
			return true
		case len(c) == 5 && (c[:2] == "08" || c[:2] == "57" || c[:2] == "53"):
			return true
		}
		return false
	}
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, context.DeadlineExceeded):
		return true
	case errors.As(err, &ne) && ne.Timeout():
		return true
	}
	return false
}

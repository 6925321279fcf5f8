package config

import (
	"errors"
	"net/url"
	"strings"

	"github.com/telco-platform/coordinator/internal/tlsfiles"
)

// validate checks the rules that span settings, group by group.
func (c Config) validate() error {
	for _, check := range []func() error{c.Lock.validate, c.HTTP.validate, c.Kafka.validate} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// checkTLSFiles loads the files once, so a bad one stops start-up naming it.
func checkTLSFiles(files tlsfiles.Files) error {
	_, err := files.Config()
	var te *tlsfiles.Error
	if errors.As(err, &te) {
		return &Error{Variable: te.Variable, Flag: flagOf(te.Variable), Value: te.Path, Err: te.Err}
	}
	return err
}

// flagOf is the flag of a COORDINATOR_* variable.
func flagOf(env string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(env, "COORDINATOR_")), "_", "-")
}

func checkPostgresURL(v string) error {
	if v == "" {
		return nil // required only by commands that touch Postgres
	}
	if strings.HasPrefix(v, "postgres://") || strings.HasPrefix(v, "postgresql://") {
		if _, err := url.Parse(v); err != nil {
			return errors.New("not a valid URL")
		}
		return nil
	}
	if strings.Contains(v, "=") { // keyword/value DSN
		return nil
	}
	return errors.New("must be a postgres:// URL or a key=value DSN")
}

func checkReplicaID(v string) error {
	if len(v) > 128 || strings.ContainsAny(v, " \t\n") {
		return errors.New("must be at most 128 characters without whitespace")
	}
	return nil
}

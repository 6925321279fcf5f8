package postgres_test

import (
	"context"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// tlsDSN is the test database's DSN with sslmode and sslrootcert replaced
// (and host, when set).
func tlsDSN(t *testing.T, host, sslmode, rootcert string) string {
	t.Helper()
	raw := os.Getenv(testenv.EnvDatabaseURL)
	if raw == "" {
		t.Skipf("%s is not set", testenv.EnvDatabaseURL)
	}
	u, err := url.Parse(raw)
	require.NoError(t, err)
	if host != "" {
		u.Host = host + ":" + u.Port()
	}
	q := u.Query()
	q.Set("sslmode", sslmode)
	q.Del("sslrootcert")
	if rootcert != "" {
		q.Set("sslrootcert", rootcert)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// connectTLS connects and reports whether the session is encrypted.
func connectTLS(t *testing.T, dsn string) (bool, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := postgres.Connect(ctx, dsn, 1)
	if err != nil {
		return false, err
	}
	defer pool.Close()
	var ssl bool
	err = pool.QueryRow(ctx, "select ssl from pg_stat_ssl where pid = pg_backend_pid()").Scan(&ssl)
	return ssl, err
}

func TestVerifyFull(t *testing.T) {
	t.Parallel()
	ca := testenv.PGTLSCAFile(t)
	for _, host := range []string{"127.0.0.1", "localhost"} {
		ssl, err := connectTLS(t, tlsDSN(t, host, "verify-full", ca))
		require.NoError(t, err, "verify-full to %s with the test CA", host)
		require.True(t, ssl, "the session is encrypted")
	}

	// verify-full refuses what it cannot verify: the system roots, another CA.
	_, err := connectTLS(t, tlsDSN(t, "", "verify-full", ""))
	require.ErrorContains(t, err, "certificate")
	foreign, _, _ := testenv.ForeignTLS(t)
	_, err = connectTLS(t, tlsDSN(t, "", "verify-full", foreign))
	require.ErrorContains(t, err, "certificate")

	// require encrypts but verifies nothing: it accepts the server whatever
	// CA signed it. This is why the documented production default is verify-full.
	ssl, err := connectTLS(t, tlsDSN(t, "", "require", ""))
	require.NoError(t, err)
	require.True(t, ssl)
}

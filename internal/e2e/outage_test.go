package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/migrate"
	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// Postgres down while a bill run is asked for: the request cannot be
// recorded (neither the claim nor run_requests can be written), so nothing
// was accepted. HTTP answers 503 with Retry-After and a problem document
// that says the failure is retryable, and the CLI exits 75 (EX_TEMPFAIL).
// Once Postgres is back the same request is accepted (202) and the period
// billed. Before, HTTP answered 500 RUN_FAILED with no Retry-After and the
// CLI exited 1, as for a bug.
func TestPostgresDownAnswers503RetryableAndExit75(t *testing.T) {
	t.Parallel()
	srv := testenv.StartPostgresServer(t)
	ctx := context.Background()
	pool, err := postgres.Connect(ctx, srv.DSN(), 4)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	m, err := migrate.New(pool)
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	d := newDeploymentOn(t, "", &testenv.PG{DSN: srv.DSN(), Pool: pool})
	period := monthsAgo(1)
	d.seedSubscribers(300, period)
	r := d.start("r1", nil, "--reaper-schedule=", "--billrun-schedule=")

	srv.Stop()
	code, hdr, body := r.post(t, d.token, "/v1/billruns", `{"period":"`+period+`","request_id":"pg-down-http"}`)
	require.Equal(t, http.StatusServiceUnavailable, code, string(body))
	require.Equal(t, "application/problem+json", hdr.Get("Content-Type"))
	retryAfter, err := strconv.Atoi(hdr.Get("Retry-After"))
	require.NoError(t, err, "Retry-After: %q", hdr.Get("Retry-After"))
	require.Positive(t, retryAfter)
	var p struct {
		Status    int    `json:"status"`
		Code      string `json:"code"`
		Reason    string `json:"reason"`
		Retryable bool   `json:"retryable"`
		LockKey   string `json:"lockKey"`
		Detail    string `json:"detail"`
	}
	require.NoError(t, json.Unmarshal(body, &p), string(body))
	require.Equal(t, http.StatusServiceUnavailable, p.Status)
	require.Equal(t, "BACKEND_UNAVAILABLE", p.Code)
	require.True(t, p.Retryable, string(body))
	require.Equal(t, "billrun:"+period, p.LockKey)
	require.Contains(t, p.Detail, "not recorded")

	// The CLI, on the same deployment: exit 75 and a retryable result.
	cli := exec.Command(testenv.CoordinatorBinary(t), "run", "billrun", "--period", period, "--request-id", "pg-down-cli")
	cli.Env = os.Environ()
	for k, v := range d.env {
		cli.Env = append(cli.Env, k+"="+v)
	}
	cli.Env = append(cli.Env, "COORDINATOR_REPLICA_ID=cli")
	out, err := cli.Output()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "exit status: %v", err)
	require.Equal(t, job.ExitTempFail, ee.ExitCode(), "stdout %s\nstderr %s", out, ee.Stderr)
	var res job.Result
	require.NoError(t, json.Unmarshal(out, &res), string(out))
	require.Equal(t, job.OutcomeFailed, res.Outcome)
	require.True(t, res.Retryable, string(out))
	require.False(t, res.Deferred, "nothing could be recorded")

	srv.Start()
	require.Eventually(t, func() bool {
		code, _, body = r.post(t, d.token, "/v1/billruns", `{"period":"`+period+`","request_id":"pg-back"}`)
		return code != http.StatusServiceUnavailable
	}, 60*time.Second, 200*time.Millisecond, "Postgres is back")
	require.Equal(t, http.StatusAccepted, code, string(body))
	done := d.events.waitFor(t, 60*time.Second, 1, "run.completed", ofType("run.completed", "billrun:"+period))
	require.Equal(t, "pg-back", done[0].str("request_id"))
	d.requireInvoicesExact(period)
	for _, l := range r.logLines() {
		require.False(t, strings.Contains(l, `"status":500`), "no 500 for a dependency outage: %s", l)
	}
}

package job_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/job"
)

// A Kafka trigger is committed only when its run completed (or had), failed
// permanently, or was handed to the resumer; a kind without a resumer keeps
// the outcome's rule, but a transient failure is retried.
func TestResultHandled(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		res  job.Result
		want bool
	}{
		{"completed", job.Result{Outcome: job.OutcomeCompleted, Resumable: true}, true},
		{"already completed", job.Result{Outcome: job.OutcomeAlreadyCompleted, Resumable: true}, true},
		{"failed permanently", job.Result{Outcome: job.OutcomeFailed, Resumable: true}, true},
		{"failed transiently, not recorded", job.Result{Outcome: job.OutcomeFailed, Retryable: true, Resumable: true}, false},
		{"failed transiently, recorded", job.Result{Outcome: job.OutcomeFailed, Retryable: true, Resumable: true, Deferred: true}, true},
		{"lost, not recorded", job.Result{Outcome: job.OutcomeLost, Resumable: true}, false},
		{"lost, recorded", job.Result{Outcome: job.OutcomeLost, Resumable: true, Deferred: true}, true},
		{"already owned, not recorded", job.Result{Outcome: job.OutcomeAlreadyOwned, Resumable: true}, false},
		{"already owned, recorded", job.Result{Outcome: job.OutcomeAlreadyOwned, Resumable: true, Deferred: true}, true},
		{"unavailable", job.Result{Outcome: job.OutcomeUnavailable, Resumable: true}, false},
		{"no resumer: already owned", job.Result{Outcome: job.OutcomeAlreadyOwned}, true},
		{"no resumer: lost", job.Result{Outcome: job.OutcomeLost}, false},
		{"no resumer: failed transiently", job.Result{Outcome: job.OutcomeFailed, Retryable: true}, false},
		{"no resumer: failed permanently", job.Result{Outcome: job.OutcomeFailed}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, c.want, c.res.Handled())
		})
	}
}

// The CLI's exit codes: a failure of a transient cause is EX_TEMPFAIL (75),
// like a lock owned by another holder: try again later; one on the caller's
// input is 64; any other failure 1.
func TestResultExitCode(t *testing.T) {
	t.Parallel()
	cases := []struct {
		res  job.Result
		want int
	}{
		{job.Result{Outcome: job.OutcomeCompleted}, job.ExitOK},
		{job.Result{Outcome: job.OutcomeAlreadyCompleted}, job.ExitOK},
		{job.Result{Outcome: job.OutcomeAlreadyOwned}, job.ExitTempFail},
		{job.Result{Outcome: job.OutcomeUnavailable}, job.ExitUnavailable},
		{job.Result{Outcome: job.OutcomeLost}, job.ExitLost},
		{job.Result{Outcome: job.OutcomeFailed}, job.ExitFailed},
		{job.Result{Outcome: job.OutcomeFailed, Retryable: true}, job.ExitTempFail},
		{job.Result{Outcome: job.OutcomeFailed, Retryable: true, Deferred: true}, job.ExitTempFail},
		{job.Result{Outcome: job.OutcomeFailed, BadInput: true}, job.ExitUsage},
	}
	for _, c := range cases {
		require.Equalf(t, c.want, c.res.ExitCode(), "%+v", c.res)
	}
	require.Equal(t, 75, job.ExitTempFail, "sysexits.h EX_TEMPFAIL")
}

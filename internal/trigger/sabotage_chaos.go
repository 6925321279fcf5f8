//go:build chaos_sabotage

package trigger

// DELIBERATELY UNSAFE: built only for the chaos verifier's sabotage pass
// (`go build -tags chaos_sabotage`, see internal/chaos). A cron tick whose
// run neither finished nor was recorded is given up after its first attempt
// (retryTickUntilDurable does not retry it): a bill-run tick that meets
// PostgreSQL down is dropped, which the verifier's cron_tick_dropped check
// must report.
const failedTickRetried = false

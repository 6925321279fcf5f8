//go:build !chaos_sabotage

package trigger

// The chaos verifier's hook (internal/chaos, `CHAOS_SABOTAGE=1 make chaos`).
// Only a binary built with `-tags chaos_sabotage` swaps in sabotage_chaos.go,
// where a cron tick whose run failed is given up after its first attempt, so
// the verifier can prove its dropped-tick check notices. In every other build,
// the shipped one included, a failed tick is retried (retryTickUntilDurable;
// TestCronNotSabotaged).
const failedTickRetried = true

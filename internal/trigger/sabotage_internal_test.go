package trigger

import "testing"

// The default build must retry a failed cron tick: the chaos verifier's
// sabotage (sabotage_chaos.go) exists only under -tags chaos_sabotage. This
// test fails if that file is ever compiled into a normal build.
func TestCronNotSabotaged(t *testing.T) {
	if !failedTickRetried {
		t.Fatal("trigger is built with the chaos_sabotage variant: a failed cron tick is not retried")
	}
}

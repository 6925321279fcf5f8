//go:build testhooks

package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/kinds"
)

// applyTestHooks sets the hooks the environment asks for on the kinds'
// configuration. A bad value is an error naming it. (The Kafka session
// timeout, once a hook, is COORDINATOR_KAFKA_SESSION_TIMEOUT.)
func applyTestHooks(getenv func(string) string, log *slog.Logger, kc *kinds.Config) error {
	raw := getenv(envTestBatchDelay)
	if raw == "" {
		return nil
	}
	d, err := time.ParseDuration(raw)
	if err != nil || d < 0 {
		return fmt.Errorf("config: %s = %q: not a duration", envTestBatchDelay, raw)
	}
	log.Warn("test_hook_enabled", "hook", envTestBatchDelay, "value", d)
	if d > 0 {
		kc.Billrun = billrun.WithBatchDelay(kc.Billrun, d)
	}
	return nil
}

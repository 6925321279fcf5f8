//go:build testhooks

package main

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/replica"
)

// applyTestHooks sets the hooks the environment asks for on reg's kinds. A
// bad value is an error naming it. (The Kafka session timeout, once a hook,
// is COORDINATOR_KAFKA_SESSION_TIMEOUT.)
func applyTestHooks(getenv func(string) string, log *slog.Logger, reg *owned.Registry, _ *replica.Replica) error {
	read := func(env string) (time.Duration, error) {
		raw := getenv(env)
		if raw == "" {
			return 0, nil
		}
		d, err := time.ParseDuration(raw)
		if err != nil || d < 0 {
			return 0, fmt.Errorf("config: %s = %q: not a duration", env, raw)
		}
		log.Warn("test_hook_enabled", "hook", env, "value", d)
		return d, nil
	}
	delay, err := read(envTestBatchDelay)
	if err != nil {
		return err
	}
	if delay > 0 {
		for _, k := range reg.Kinds() {
			if d, ok := k.(interface{ SetBatchDelay(time.Duration) }); ok {
				d.SetBatchDelay(delay)
			}
		}
	}
	return nil
}

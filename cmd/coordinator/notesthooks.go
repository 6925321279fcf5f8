//go:build !testhooks

package main

import (
	"log/slog"

	"github.com/telco-platform/coordinator/internal/kinds"
)

// applyTestHooks: a production build has no test hooks. A hook variable set
// by mistake is named in a warning, so nobody believes it took effect.
func applyTestHooks(getenv func(string) string, log *slog.Logger, _ *kinds.Config) error {
	for _, env := range []string{envTestBatchDelay} {
		if getenv(env) != "" {
			log.Warn("test_hook_ignored", "variable", env, "detail", "this binary was built without -tags testhooks")
		}
	}
	return nil
}

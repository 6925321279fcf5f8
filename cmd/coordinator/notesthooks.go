//go:build !testhooks

package main

import (
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/telco-platform/coordinator/internal/kinds"
)

// applyTestHooks: a production build has no test hooks. A hook variable set
// by mistake is named in a warning, so nobody believes it took effect.
func applyTestHooks(getenv func(string) string, log *slog.Logger, _ *kinds.Config) error {
	for _, env := range []string{envTestBatchDelay, envTestRedisAddrMap} {
		if getenv(env) != "" {
			log.Warn("test_hook_ignored", "variable", env, "detail", "this binary was built without -tags testhooks")
		}
	}
	return nil
}

// redisTestDialer: a production build dials Redis as go-redis does.
func redisTestDialer(time.Duration) (func(ctx context.Context, network, addr string) (net.Conn, error), error) {
	return nil, nil
}

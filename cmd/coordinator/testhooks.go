//go:build testhooks

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/kinds"
)

// applyTestHooks sets the hooks the environment asks for on the kinds'
// configuration. A bad value is an error naming it. (The Kafka session
// timeout, once a hook, is COORDINATOR_KAFKA_SESSION_TIMEOUT.)
func applyTestHooks(getenv func(string) string, log *slog.Logger, kc *kinds.Config) error {
	if raw := getenv(envTestRedisAddrMap); raw != "" {
		if _, err := parseAddrMap(raw); err != nil {
			return err
		}
		log.Warn("test_hook_enabled", "hook", envTestRedisAddrMap, "value", raw)
	}
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

// redisTestDialer is the lock's Redis dialer when COORDINATOR_TEST_REDIS_ADDR_MAP
// is set (nil otherwise): a connection to a listed address goes to the
// address it maps to; any other address is dialled as it is. Plaintext only.
func redisTestDialer(dialTimeout time.Duration) (func(ctx context.Context, network, addr string) (net.Conn, error), error) {
	raw := os.Getenv(envTestRedisAddrMap)
	if raw == "" {
		return nil, nil
	}
	m, err := parseAddrMap(raw)
	if err != nil {
		return nil, err
	}
	d := &net.Dialer{Timeout: dialTimeout, KeepAlive: 5 * time.Minute}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if to, ok := m[addr]; ok {
			addr = to
		}
		return d.DialContext(ctx, network, addr)
	}, nil
}

// parseAddrMap reads "host:port=host:port,...".
func parseAddrMap(raw string) (map[string]string, error) {
	m := map[string]string{}
	for _, pair := range strings.Split(raw, ",") {
		from, to, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || !validHostPort(from) || !validHostPort(to) {
			return nil, fmt.Errorf("config: %s = %q: want host:port=host:port,... (%q is not)", envTestRedisAddrMap, raw, pair)
		}
		m[from] = to
	}
	return m, nil
}

func validHostPort(s string) bool {
	h, p, err := net.SplitHostPort(s)
	return err == nil && h != "" && p != ""
}

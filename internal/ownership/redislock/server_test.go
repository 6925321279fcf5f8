package redislock_test

import (
	"testing"

	"github.com/telco-platform/coordinator/internal/testenv"
)

// startThrowaway is a redis-server of the test's own, which the test may kill
// and restart. Never the shared services.
func startThrowaway(t testing.TB) *testenv.RedisServer { return testenv.StartRedisServer(t) }

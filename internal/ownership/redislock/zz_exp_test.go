package redislock

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func rusage() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func redisCPU(c *redis.Client) time.Duration {
	info, _ := c.Info(context.Background(), "cpu").Result()
	var t float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			t += f
		}
	}
	return time.Duration(t * float64(time.Second))
}

func TestExpCPU(t *testing.T) {
	if os.Getenv("EXP") == "" {
		t.Skip()
	}
	env := testenv.Redis(t)
	g, _ := strconv.Atoi(os.Getenv("EXP_G"))
	n, _ := strconv.Atoi(os.Getenv("EXP_N"))
	client, _ := NewClient(env.URL, ModeSingle)
	l, _ := New(client, Config{Prefix: env.Prefix, Owner: "x", WaitTime: 30 * time.Second})
	defer l.Close()
	raw, _ := NewClient(env.URL, ModeSingle)
	del := redis.NewScript(`if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0`)
	ctx := context.Background()
	ours := func(key string) error {
		le, err := l.Acquire(ctx, key, 30*time.Second)
		if err != nil {
			return err
		}
		return le.Release(ctx)
	}
	floor := func(key string) error {
		k := env.Prefix + ":raw:" + key
		ok, err := raw.SetNX(ctx, k, "tok", 30*time.Second).Result()
		if err != nil || !ok {
			return fmt.Errorf("setnx %v %v", ok, err)
		}
		return del.Run(ctx, raw, []string{k}, "tok").Err()
	}
	admin := redis.NewClient(&redis.Options{Addr: strings.TrimSuffix(strings.TrimPrefix(env.URL, "redis://"), "/0")})
	for round := 0; round < 3; round++ {
		for _, v := range []struct {
			name string
			f    func(string) error
		}{{"ours", ours}, {"floor", floor}} {
			if os.Getenv("EXP_V") != "" && os.Getenv("EXP_V") != v.name {
				continue
			}
			c0, r0, w0 := rusage(), redisCPU(admin), time.Now()
			var wg sync.WaitGroup
			for w := 0; w < g; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < n; i++ {
						if err := v.f("k" + strconv.Itoa(w)); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			pairs := float64(g * n)
			fmt.Printf("%-6s g=%d client %.1fus/pair redis %.1fus/pair wall %.0f pairs/s\n", v.name, g,
				float64(rusage()-c0)/1e3/pairs, float64(redisCPU(admin)-r0)/1e3/pairs, pairs/time.Since(w0).Seconds())
		}
	}
}

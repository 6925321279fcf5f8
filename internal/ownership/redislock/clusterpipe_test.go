package redislock_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/ownership/redislock"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// nodePipelines records what every node client of a cluster client sends:
// per command or pipeline, the node, the slots of its lock scripts' keys
// and its commands' names.
type nodePipelines struct {
	mu   sync.Mutex
	sent []nodeSend
}

type nodeSend struct {
	addr  string
	slots []int
	names []string
}

func (r *nodePipelines) on(addr string) redis.Hook { return &nodeHook{r: r, addr: addr} }

type nodeHook struct {
	r    *nodePipelines
	addr string
}

func (h *nodeHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *nodeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return asProcessHook(h.ProcessPipelineHook, next)
}
func (h *nodeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		s := nodeSend{addr: h.addr}
		for _, c := range cmds {
			name := redislock.ScriptName(c)
			if name == "" {
				name = strings.ToLower(c.Name())
			} else if args := c.Args(); len(args) > 3 {
				s.slots = append(s.slots, redislock.SlotOf(fmt.Sprint(args[3])))
			}
			s.names = append(s.names, name)
		}
		h.r.mu.Lock()
		h.r.sent = append(h.r.sent, s)
		h.r.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (r *nodePipelines) maxAcquires() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.sent {
		n = max(n, count(s.names, "acquire"))
	}
	return n
}

// Auto-pipelining on a cluster with replicas: concurrent acquisitions of
// keys on every master share pipelines per node; each pipeline carries only
// keys of the node it goes to, one that carries acquisitions ends with one
// WAIT, and every lock is on its master's replica when Acquire returns.
func TestClusterPipelinesGoToOneNodeEach(t *testing.T) {
	t.Parallel()
	c := testenv.StartRedisCluster(t, 3, 1)
	rec := &nodePipelines{}
	o, err := redislock.ParseOptions(c.URL(), redislock.ModeCluster)
	require.NoError(t, err)
	co := o.Cluster()
	co.NewClient = func(opt *redis.Options) *redis.Client {
		n := redis.NewClient(opt)
		n.AddHook(rec.on(opt.Addr))
		return n
	}
	client := redis.NewClusterClient(co)
	l, err := redislock.New(client, redislock.Config{Prefix: "cp", Owner: "cp", WaitTime: 10 * time.Second,
		ReplicaTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = l.Close()
		_ = client.Close()
	})
	// Where each slot's lock must be: its master, and that master's replica
	// (read with READONLY).
	replicaOf := map[string]*redis.Client{}
	for i, m := range c.Masters {
		r := c.Replicas[i][0]
		rc := redis.NewClient(&redis.Options{Addr: r.Addr(), OnConnect: func(ctx context.Context, cn *redis.Conn) error {
			return cn.ReadOnly(ctx).Err()
		}})
		t.Cleanup(func() { _ = rc.Close() })
		replicaOf[m.Addr()] = rc
	}
	var smu sync.Mutex
	masterOf := map[int]string{}
	master := func(slot int) string {
		smu.Lock()
		defer smu.Unlock()
		if a, ok := masterOf[slot]; ok {
			return a
		}
		masterOf[slot] = c.MasterOf(t, slot).Addr()
		return masterOf[slot]
	}
	ctx := context.Background()
	lockKey := func(k string) string { return "cp:{" + k + "}:lock" }
	// Rounds of 32 goroutines until a pipeline carried two acquisitions
	// (on 2 cores the first round almost always does).
	for round := 0; round < 10 && rec.maxAcquires() < 2; round++ {
		var wg sync.WaitGroup
		errs := make(chan error, 32*8)
		for g := range 32 {
			wg.Go(func() {
				for i := range 8 {
					key := fmt.Sprintf("r%d-g%d-k%d", round, g, i)
					le, err := l.Acquire(ctx, key, 30*time.Second)
					if err != nil {
						errs <- fmt.Errorf("%s: %w", key, err)
						return
					}
					n, err := replicaOf[master(redislock.SlotOf(lockKey(key)))].Exists(ctx, lockKey(key)).Result()
					if err != nil || n != 1 {
						errs <- fmt.Errorf("%s acquired but not on its master's replica: %d, %v", key, n, err)
					}
					if err := le.Release(ctx); err != nil {
						errs <- fmt.Errorf("%s: release: %w", key, err)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
	}
	require.GreaterOrEqual(t, rec.maxAcquires(), 2, "no pipeline carried two acquisitions")
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, s := range rec.sent {
		for _, slot := range s.slots {
			require.Equal(t, master(slot), s.addr, "a pipeline to %s carried a key of slot %d: %v", s.addr, slot, s.names)
		}
		if count(s.names, "acquire") > 0 {
			require.Equal(t, "wait", s.names[len(s.names)-1], "acquisitions without a WAIT after them: %v", s.names)
			require.Equal(t, 1, count(s.names, "wait"), "%v", s.names)
		}
	}
}

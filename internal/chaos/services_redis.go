package chaos

// The verifier's Redis: a master, a replica and a Sentinel.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/telco-platform/coordinator/internal/localsvc"
)

// ------------------------------------------------------------------ Redis

// sentinelMaster is the master name the sentinel monitors.
const sentinelMaster = "chaos"

// redisNode is one redis-server (master or replica, roles change on
// failover), started without persistence: a restart comes back empty.
type redisNode struct {
	name string
	bin  string
	dir  string
	logs string
	port int

	mu   sync.Mutex
	proc *proc
}

func (n *redisNode) addr() string { return fmt.Sprintf("127.0.0.1:%d", n.port) }

// start runs the node; replicaOf > 0 makes it a replica of that port.
func (n *redisNode) start(ctx context.Context, replicaOf int) error {
	args := localsvc.RedisArgs(n.port, n.dir, "--loglevel", "warning", "--enable-debug-command", "yes", "--protected-mode", "no")
	if replicaOf > 0 {
		args = append(args, "--replicaof", "127.0.0.1", strconv.Itoa(replicaOf))
	}
	p, err := startProc(n.name, exec.Command(n.bin, args...), procOptions{logPath: n.logs})
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.proc = p
	n.mu.Unlock()
	c := redis.NewClient(&redis.Options{Addr: n.addr(), DialTimeout: 300 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	if !waitFor(ctx, 15*time.Second, 50*time.Millisecond, func() bool {
		pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		return c.Ping(pctx).Err() == nil || p.exited()
	}) || p.exited() {
		return fmt.Errorf("%s did not answer on %s: %s", n.name, n.addr(), strings.Join(p.tailLines(5), " | "))
	}
	return nil
}

// kill SIGKILLs the node and waits for it to exit.
func (n *redisNode) kill() {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p != nil {
		_ = p.signal(syscall.SIGKILL)
		<-p.done
	}
}

func (n *redisNode) stop() {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	p.stop(syscall.SIGTERM, 5*time.Second)
}

// redisSet is a master, a replica and a sentinel monitoring them.
type redisSet struct {
	nodes        [2]*redisNode
	sentinel     *proc
	sentinelPort int
	dir          string
	logs         string
	bin          string
}

func startRedisSet(ctx context.Context, bin, dir, logDir string) (*redisSet, error) {
	s := &redisSet{dir: dir, logs: logDir, bin: bin}
	for i := range s.nodes {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		nd := filepath.Join(dir, fmt.Sprintf("redis-%d", i))
		if err := os.MkdirAll(nd, 0o755); err != nil {
			return nil, err
		}
		s.nodes[i] = &redisNode{name: fmt.Sprintf("redis-%d", i), bin: bin, dir: nd, port: port,
			logs: filepath.Join(logDir, fmt.Sprintf("redis-%d.log", i))}
	}
	if err := s.nodes[0].start(ctx, 0); err != nil {
		return s, err
	}
	if err := s.nodes[1].start(ctx, s.nodes[0].port); err != nil {
		return s, err
	}
	if !s.waitReplicaSynced(ctx, 20*time.Second) {
		return s, errors.New("redis replica did not sync with its master")
	}
	port, err := freePort()
	if err != nil {
		return s, err
	}
	s.sentinelPort = port
	// down-after must exceed the longest DEBUG SLEEP the verifier issues, so
	// a stall is a stall and not a failover.
	args, err := localsvc.SentinelArgs(port, dir, "protected-mode no", "daemonize no", "sentinel resolve-hostnames no",
		fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1", sentinelMaster, s.nodes[0].port),
		"sentinel down-after-milliseconds "+sentinelMaster+" 5000",
		"sentinel failover-timeout "+sentinelMaster+" 20000",
		"sentinel parallel-syncs "+sentinelMaster+" 1")
	if err != nil {
		return s, err
	}
	p, err := startProc("sentinel", exec.Command(bin, args...), procOptions{logPath: filepath.Join(logDir, "sentinel.log")})
	if err != nil {
		return s, err
	}
	s.sentinel = p
	sc := s.sentinelClient()
	defer sc.Close()
	if !waitFor(ctx, 30*time.Second, 100*time.Millisecond, func() bool {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		reps, err := sc.Replicas(cctx, sentinelMaster).Result()
		return err == nil && len(reps) >= 1
	}) {
		return s, fmt.Errorf("sentinel on 127.0.0.1:%d did not discover the replica: %s", port, strings.Join(p.tailLines(5), " | "))
	}
	return s, nil
}

func (s *redisSet) sentinelClient() *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", s.sentinelPort),
		DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second, MaxRetries: -1})
}

// URL is the lock backend URL in sentinel mode.
func (s *redisSet) URL() string {
	return fmt.Sprintf("redis://127.0.0.1:%d/0?master_name=%s", s.sentinelPort, sentinelMaster)
}

// master returns the node the sentinel names as master (nil if unknown).
func (s *redisSet) master(ctx context.Context) *redisNode {
	sc := s.sentinelClient()
	defer sc.Close()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	addr, err := sc.GetMasterAddrByName(cctx, sentinelMaster).Result()
	if err != nil || len(addr) != 2 {
		return nil
	}
	port, _ := strconv.Atoi(addr[1])
	for _, n := range s.nodes {
		if n.port == port {
			return n
		}
	}
	return nil
}

// waitReplicaSynced waits until some node is a replica with its link up.
func (s *redisSet) waitReplicaSynced(ctx context.Context, bound time.Duration) bool {
	return waitFor(ctx, bound, 100*time.Millisecond, func() bool {
		for _, n := range s.nodes {
			c := redis.NewClient(&redis.Options{Addr: n.addr(), DialTimeout: 300 * time.Millisecond, MaxRetries: -1})
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			info, err := c.Info(cctx, "replication").Result()
			cancel()
			c.Close()
			if err == nil && strings.Contains(info, "role:slave") && strings.Contains(info, "master_link_status:up") {
				return true
			}
		}
		return false
	})
}

func (s *redisSet) stop() {
	if s.sentinel != nil {
		s.sentinel.stop(syscall.SIGTERM, 5*time.Second)
	}
	for _, n := range s.nodes {
		if n != nil {
			n.stop()
		}
	}
}

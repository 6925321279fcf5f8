package testenv

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/localsvc"
)

// RedisServer is a redis-server of the test's own on a free loopback port,
// which the test may stop and start again at the same address (outage
// tests), pause (SIGSTOP) and resume. The shared services are never
// touched. The server is killed when the test ends, and also if the test
// binary itself dies (Pdeathsig), so a killed or timed-out test run leaves
// nothing behind.
//
// Start, Stop, Pause and Resume must be called from the test's goroutine.
type RedisServer struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	opts RedisServerOptions
	proc *localsvc.Process
}

// RedisServerOptions shape a throwaway server. The zero value is a plain
// standalone server without persistence.
type RedisServerOptions struct {
	// Args are extra redis-server arguments, e.g. "--enable-debug-command",
	// "yes" (DEBUG SLEEP stalls) or "--maxmemory-policy", "allkeys-lru".
	Args []string
	// ReplicaOf, host:port, starts the server as a replica of that master.
	ReplicaOf string
	// SentinelConf, when set, runs the server as a Sentinel
	// (`redis-server sentinel.conf --sentinel`) with these config lines; the
	// port, bind and dir lines are added.
	SentinelConf []string
}

// StartRedisServer starts a throwaway standalone redis-server and waits
// until it answers.
func StartRedisServer(t testing.TB) *RedisServer {
	t.Helper()
	return StartRedisServerWith(t, RedisServerOptions{})
}

// StartRedisServerWith starts a throwaway redis-server shaped by o and
// waits until it logs that it accepts connections.
func StartRedisServerWith(t testing.TB, o RedisServerOptions) *RedisServer {
	t.Helper()
	s := &RedisServer{t: t, bin: Binary(t, EnvRedisServerBin, "/usr/bin/redis-server"), dir: t.TempDir(), port: freeLoopbackPort(t), opts: o}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Addr is host:port; URL is a redis:// URL for db 0.
func (s *RedisServer) Addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }
func (s *RedisServer) URL() string  { return "redis://" + s.Addr() + "/0" }

// Port is the server's TCP port.
func (s *RedisServer) Port() int { return s.port }

func (s *RedisServer) args() []string {
	if s.opts.SentinelConf != nil {
		args, err := localsvc.SentinelArgs(s.port, s.dir, s.opts.SentinelConf...)
		if err != nil {
			s.t.Fatalf("testenv: write sentinel.conf: %v", err)
		}
		return args
	}
	var extra []string
	if s.opts.ReplicaOf != "" {
		host, port, _ := net.SplitHostPort(s.opts.ReplicaOf)
		extra = append(extra, "--replicaof", host, port)
	}
	return localsvc.RedisArgs(s.port, s.dir, append(extra, s.opts.Args...)...)
}

// PID is the server's process id (0 while stopped).
func (s *RedisServer) PID() int {
	if s.proc == nil {
		return 0
	}
	return s.proc.PID()
}

// Start (re)starts the server on its port and waits until it logs that it
// accepts connections. Safe when already running.
func (s *RedisServer) Start() {
	s.t.Helper()
	if s.proc != nil {
		return
	}
	ready := localsvc.RedisReady
	if s.opts.SentinelConf != nil {
		ready = localsvc.SentinelReady
	}
	p, err := localsvc.Start(exec.Command(s.bin, s.args()...), ready, time.Minute, nil)
	if err != nil {
		s.t.Fatalf("testenv: redis-server on %s: %v", s.Addr(), err)
	}
	s.proc = p
}

// Stop SIGKILLs the server (by its PID) and waits until it has exited. Safe
// when already stopped.
func (s *RedisServer) Stop() {
	if s.proc == nil {
		return
	}
	_ = s.proc.Signal(syscall.SIGCONT) // a paused process dies too, but do not leave it stopped
	_ = s.proc.Stop(syscall.SIGKILL, time.Minute)
	s.proc = nil
}

// Pause stops the server process (SIGSTOP): connections stay open, nothing
// is answered, replication stops. Resume continues it.
func (s *RedisServer) Pause() {
	if s.proc != nil {
		_ = s.proc.Signal(syscall.SIGSTOP)
	}
}

// Resume continues a paused server (SIGCONT).
func (s *RedisServer) Resume() {
	if s.proc != nil {
		_ = s.proc.Signal(syscall.SIGCONT)
	}
}

// Client returns a client on the server, closed when the test ends.
func (s *RedisServer) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stall blocks the server's event loop for d with DEBUG SLEEP (the server
// needs RedisServerOptions.Args "--enable-debug-command", "yes") and
// returns once the server has stopped answering, so that whatever the
// caller sends next waits in the server's buffers until the stall ends.
// The returned channel closes when DEBUG SLEEP has returned.
func (s *RedisServer) Stall(t testing.TB, d time.Duration) <-chan struct{} {
	t.Helper()
	sleeper := redis.NewClient(&redis.Options{Addr: s.Addr(), ReadTimeout: d + 10*time.Second, MaxRetries: -1})
	probe := redis.NewClient(&redis.Options{Addr: s.Addr(), ReadTimeout: 50 * time.Millisecond, MaxRetries: -1, PoolSize: 1})
	defer probe.Close()
	must := func(err error) {
		if err != nil {
			t.Fatalf("testenv: stall %s: %v", s.Addr(), err)
		}
	}
	must(probe.Ping(context.Background()).Err()) // a connection before the stall
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer sleeper.Close()
		if err := sleeper.Do(context.Background(), "debug", "sleep", strconv.FormatFloat(d.Seconds(), 'f', 3, 64)).Err(); err != nil {
			t.Errorf("testenv: DEBUG SLEEP on %s: %v", s.Addr(), err)
		}
	}()
	// The probe connection was made before the stall: a PING that times
	// out means the event loop is asleep.
	var stalled bool
	require.Eventually(t, func() bool {
		if probe.Ping(context.Background()).Err() != nil {
			stalled = true
			return true
		}
		select {
		case <-done: // the sleep is over and was never seen
			return true
		default:
			return false
		}
	}, 5*time.Second, time.Millisecond)
	if !stalled {
		t.Fatalf("testenv: %s never seen stalled by DEBUG SLEEP", s.Addr())
	}
	return done
}

// RedisSentinelSet is a master, one replica and one Sentinel (quorum 1,
// down-after 1s), all throwaway redis-servers of the test's own: a test may
// kill the master and watch Sentinel promote the replica.
type RedisSentinelSet struct {
	Master, Replica, Sentinel *RedisServer
	// MasterName is the name Sentinel monitors.
	MasterName string
}

// StartRedisSentinelSet starts the set and waits until the replica is in
// sync and Sentinel knows both servers. args go to master and replica.
func StartRedisSentinelSet(t testing.TB, args ...string) *RedisSentinelSet {
	t.Helper()
	master := StartRedisServerWith(t, RedisServerOptions{Args: args})
	replica := StartRedisServerWith(t, RedisServerOptions{Args: args, ReplicaOf: master.Addr()})
	s := &RedisSentinelSet{Master: master, Replica: replica, MasterName: "testmaster"}
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr(), MaxRetries: -1})
	defer rc.Close()
	waitFor(t, 20*time.Second, "replica in sync", func(ctx context.Context) bool {
		info, err := rc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	// The master's own view lags the replica's: a Locker that reads the
	// replica count (WaitReplicas auto) before the master lists it online
	// would wait for no replica at all.
	mc := redis.NewClient(&redis.Options{Addr: master.Addr(), MaxRetries: -1})
	defer mc.Close()
	waitFor(t, 20*time.Second, "master lists the replica online", func(ctx context.Context) bool {
		info, err := mc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "state=online")
	})
	s.Sentinel = StartRedisServerWith(t, RedisServerOptions{SentinelConf: []string{
		fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 1", s.MasterName, master.Port()),
		"sentinel down-after-milliseconds " + s.MasterName + " 1000",
		"sentinel failover-timeout " + s.MasterName + " 5000",
		"sentinel parallel-syncs " + s.MasterName + " 1",
	}})
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinel.Addr()})
	defer sc.Close()
	waitFor(t, 20*time.Second, "sentinel sees the replica", func(ctx context.Context) bool {
		rs, err := sc.Replicas(ctx, s.MasterName).Result()
		return err == nil && len(rs) == 1
	})
	return s
}

// URL is the sentinel-mode lock URL (redislock.ParseOptions' format).
func (s *RedisSentinelSet) URL() string {
	return "redis://" + s.Sentinel.Addr() + "/0?master_name=" + s.MasterName
}

// MasterAddr asks Sentinel which server is the master now.
func (s *RedisSentinelSet) MasterAddr(ctx context.Context) (string, error) {
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinel.Addr()})
	defer sc.Close()
	hp, err := sc.GetMasterAddrByName(ctx, s.MasterName).Result()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// WaitMaster waits until Sentinel names addr as the master and addr itself
// answers as a master.
func (s *RedisSentinelSet) WaitMaster(t testing.TB, addr string, within time.Duration) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	waitFor(t, within, "sentinel promotes "+addr, func(ctx context.Context) bool {
		got, err := s.MasterAddr(ctx)
		if err != nil || got != addr {
			return false
		}
		info, err := c.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "role:master")
	})
}

// waitFor waits (require.Eventually) until cond holds, each call of it
// bounded by a second, or fails the test naming what.
func waitFor(t testing.TB, within time.Duration, what string, cond func(ctx context.Context) bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return cond(ctx)
	}, within, 50*time.Millisecond, "testenv: %s", what)
}

// CutReplication makes the master's next writes miss the replica for good
// when the master dies: the replica is paused, and the master writes junk
// until the replication stream backs up into the master's own output buffer
// (the kernel's socket buffers are full). Whatever is written next waits in
// that buffer, and a killed master takes it along. Resume the replica with
// Replica.Resume.
func (s *RedisSentinelSet) CutReplication(t testing.TB) {
	t.Helper()
	s.Replica.Pause()
	c := redis.NewClient(&redis.Options{Addr: s.Master.Addr()})
	defer c.Close()
	ctx := context.Background()
	junk := strings.Repeat("x", 1<<20)
	for i := range 256 {
		if err := c.Set(ctx, "testenv:junk:"+strconv.Itoa(i), junk, 0).Err(); err != nil {
			t.Fatalf("testenv: cut replication: %v", err)
		}
		list, err := c.Do(ctx, "client", "list", "type", "replica").Text()
		if err != nil {
			t.Fatalf("testenv: cut replication: %v", err)
		}
		if omem := clientField(list, "omem"); omem >= 1<<20 {
			return
		}
	}
	t.Fatal("testenv: cut replication: the replication stream never backed up")
}

// clientField reads a numeric field (name=N) of the first CLIENT LIST line.
func clientField(list, name string) int64 {
	for _, f := range strings.Fields(list) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return -1
}

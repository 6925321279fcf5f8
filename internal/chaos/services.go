package chaos

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/localsvc"
)

// The verifier's own services: nothing here touches the shared test
// services. Every server listens on a free loopback port, is a child of the
// verifier (dies with it) and is stopped by its PID.

// freePort is a loopback port nobody listens on, below the ephemeral range
// (localsvc.FreePort).
func freePort() (int, error) { return localsvc.FreePort() }

// pause waits d or until ctx ends; it reports whether d passed.
func pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// waitFor polls cond every step until it holds, ctx ends or bound passes.
func waitFor(ctx context.Context, bound, step time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(bound)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) || !pause(ctx, step) {
			return false
		}
	}
}

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

// --------------------------------------------------------------- Postgres

// pgServer is a throwaway PostgreSQL cluster: initdb once, then the postgres
// binary as a direct child (as the postgres OS user when we are root,
// because PostgreSQL refuses to run as root).
type pgServer struct {
	bin  string
	dir  string
	data string
	logs string
	port int

	mu   sync.Mutex
	proc *proc
}

func (s *pgServer) dsn() string { return localsvc.PostgresDSN(s.port) }

func startPostgres(ctx context.Context, bin, dir, logDir string) (*pgServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &pgServer{bin: bin, dir: dir, logs: filepath.Join(logDir, "postgres.log"), port: port}
	if s.data, err = localsvc.InitPostgres(ctx, bin, dir); err != nil {
		return nil, err
	}
	return s, s.start(ctx)
}

func (s *pgServer) start(ctx context.Context) error {
	cmd, err := localsvc.PostgresCommand(s.bin, s.data, s.port,
		// fsync off only risks an OS crash. synchronous_commit keeps its
		// default (on): a crash (immediate shutdown) then loses nothing
		// acknowledged, except during the postgres-lost-commits fault, which
		// turns it off with ALTER SYSTEM (so it is not set here: a command
		// line setting would win over ALTER SYSTEM).
		"max_connections=300", "shared_buffers=128MB", "log_min_messages=warning",
		"log_line_prefix=%m [%p] ",
		// Commit times of rows (pg_xact_commit_timestamp): the order in
		// which batches really committed, not when their rows were written.
		"track_commit_timestamp=on")
	if err != nil {
		return err
	}
	// SIGQUIT is the postmaster's immediate shutdown: it dies with us.
	p, err := startProc("postgres", cmd, procOptions{logPath: s.logs, deathSig: syscall.SIGQUIT})
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	if !waitFor(ctx, 60*time.Second, 100*time.Millisecond, func() bool {
		if p.exited() {
			return true
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		c, err := pgx.Connect(cctx, s.dsn())
		if err != nil {
			return false
		}
		c.Close(cctx)
		return true
	}) || p.exited() {
		return fmt.Errorf("postgres did not start on 127.0.0.1:%d: %s", s.port, strings.Join(p.tailLines(5), " | "))
	}
	return nil
}

// halt stops the postmaster: SIGINT is a fast shutdown, SIGQUIT an immediate
// one (crash recovery at the next start).
func (s *pgServer) halt(sig syscall.Signal) {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p != nil {
		p.stop(sig, 30*time.Second)
	}
}

// ------------------------------------------------------------------ Kafka

// kafkaServer is a single-node KRaft broker+controller run from the jars
// scripts/services fetches (`scripts/services install kafka`).
type kafkaServer struct {
	java     string
	libs     string
	log4j    string
	dir      string
	logs     string
	port     int
	ctrlPort int
	props    string
	// extra are listeners of their own, one per replica slot, each
	// advertising the slot's proxy (netproxy.go).
	extra []kafkaListener

	mu   sync.Mutex
	proc *proc
}

// kafkaListener is a broker listener of its own: clients that connect to
// it get Advertised in the metadata, so every later connection goes there.
type kafkaListener struct {
	Name       string // upper-case listener name, e.g. R1
	Port       int    // where the broker listens
	Advertised string // host:port the broker advertises on it
}

func (k *kafkaServer) brokers() []string { return []string{fmt.Sprintf("127.0.0.1:%d", k.port)} }

func startKafka(ctx context.Context, java, libs, log4j, dir, logDir string, extra []kafkaListener) (*kafkaServer, error) {
	k := &kafkaServer{java: java, libs: libs, log4j: log4j, dir: dir, logs: filepath.Join(logDir, "kafka.log"), extra: extra}
	var err error
	if k.port, err = freePort(); err != nil {
		return nil, err
	}
	var listeners, advertised, protocols string
	for _, l := range extra {
		listeners += fmt.Sprintf(",%s://127.0.0.1:%d", l.Name, l.Port)
		advertised += fmt.Sprintf(",%s://%s", l.Name, l.Advertised)
		protocols += fmt.Sprintf(",%s:PLAINTEXT", l.Name)
	}
	if k.ctrlPort, err = freePort(); err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return nil, err
	}
	k.props = filepath.Join(dir, "server.properties")
	props := fmt.Sprintf(`process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:%[2]d
listeners=PLAINTEXT://127.0.0.1:%[1]d,CONTROLLER://127.0.0.1:%[2]d%[4]s
advertised.listeners=PLAINTEXT://127.0.0.1:%[1]d%[5]s
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT%[6]s
log.dirs=%[3]s
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
num.partitions=3
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=3
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.hours=24
log.segment.bytes=67108864
`, k.port, k.ctrlPort, data, listeners, advertised, protocols)
	if err := os.WriteFile(k.props, []byte(props), 0o644); err != nil {
		return nil, err
	}
	var id [16]byte
	_, _ = rand.Read(id[:])
	// The top bit is cleared so the id never starts with '-': the storage
	// tool's argument parser takes "-t -xyz" for a missing value (1 format in 64
	// failed so).
	id[0] &= 0x7f
	clusterID := strings.TrimRight(base64.URLEncoding.EncodeToString(id[:]), "=")
	format := exec.CommandContext(ctx, java, k.javaArgs("kafka.tools.StorageTool", "format", "-t", clusterID, "-c", k.props, "--ignore-formatted")...)
	if out, err := format.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("kafka storage format: %v: %s", err, lastLines(string(out), 5))
	}
	return k, k.start(ctx)
}

func (k *kafkaServer) javaArgs(main string, args ...string) []string {
	out := []string{"-Djava.awt.headless=true", "-Dkafka.logs.dir=" + k.dir}
	if k.log4j != "" {
		out = append(out, "-Dlog4j2.configurationFile="+k.log4j)
	}
	out = append(out, "-cp", filepath.Join(k.libs, "*"), main)
	return append(out, args...)
}

func (k *kafkaServer) start(ctx context.Context) error {
	args := append([]string{"-Xms128m", "-Xmx512m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError"},
		k.javaArgs("kafka.Kafka", k.props)...)
	p, err := startProc("kafka", exec.Command(k.java, args...), procOptions{logPath: k.logs})
	if err != nil {
		return err
	}
	k.mu.Lock()
	k.proc = p
	k.mu.Unlock()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.brokers()...), kgo.DialTimeout(time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if !waitFor(ctx, 120*time.Second, 250*time.Millisecond, func() bool {
		if p.exited() {
			return true
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		bs, err := adm.ListBrokers(cctx)
		return err == nil && len(bs) == 1
	}) || p.exited() {
		return fmt.Errorf("kafka did not start on 127.0.0.1:%d: %s", k.port, strings.Join(p.tailLines(8), " | "))
	}
	return nil
}

func (k *kafkaServer) halt(sig syscall.Signal) {
	k.mu.Lock()
	p := k.proc
	k.mu.Unlock()
	if p != nil {
		p.stop(sig, 30*time.Second)
	}
}

// -------------------------------------------------------------- binaries

// Binaries are the external programs the verifier runs.
type Binaries struct {
	Coordinator string // the coordinator binary under test
	Helper      string // the verifier's own binary, run as the critical-section helper
	RedisServer string
	PGBinDir    string
	Java        string
	KafkaLibs   string // directory of the Kafka jars
	KafkaLog4j  string // optional log4j2 config for the broker
}

// ErrMissing marks a program or file the verifier needs that is not there.
var ErrMissing = errors.New("chaos: missing prerequisite")

// FindBinaries fills the empty fields of b from the environment, PATH and the
// Debian locations, and says in one error what is missing and how to get it.
func FindBinaries(b Binaries, repoRoot string) (Binaries, error) {
	var missing []string
	exe := func(p string) bool {
		st, err := os.Stat(p)
		return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
	}
	if b.Coordinator == "" || !exe(b.Coordinator) {
		missing = append(missing, fmt.Sprintf("the coordinator binary %q (make build, or set CHAOS_COORDINATOR)", b.Coordinator))
	}
	if b.RedisServer == "" {
		b.RedisServer = os.Getenv("COORDINATOR_TEST_REDIS_SERVER_BIN")
	}
	if b.RedisServer == "" {
		b.RedisServer, _ = localsvc.RedisServer("") // PATH's, else Debian's
	}
	if !exe(b.RedisServer) {
		missing = append(missing, "redis-server (scripts/services install redis)")
	}
	if b.PGBinDir == "" {
		b.PGBinDir = os.Getenv("COORDINATOR_TEST_PG_BIN_DIR")
	}
	if b.PGBinDir == "" {
		b.PGBinDir, _ = localsvc.PostgresBinDir("") // the newest Debian one, else PATH's
	}
	if !exe(filepath.Join(b.PGBinDir, "initdb")) || !exe(filepath.Join(b.PGBinDir, "postgres")) {
		missing = append(missing, "PostgreSQL's initdb and postgres (scripts/services install postgres, or set COORDINATOR_TEST_PG_BIN_DIR)")
	}
	if b.Java == "" {
		if p, err := exec.LookPath("java"); err == nil {
			b.Java = p
		}
	}
	if !exe(b.Java) {
		missing = append(missing, "java (scripts/services install kafka)")
	}
	if b.KafkaLibs == "" {
		b.KafkaLibs = findKafkaLibs(repoRoot)
	}
	if b.KafkaLibs == "" {
		missing = append(missing, "the Kafka jars (scripts/services install kafka fetches them into .cache/kafka/<version>/libs; or set CHAOS_KAFKA_LIBS or SERVICES_CACHE_DIR)")
	}
	if b.KafkaLog4j == "" && repoRoot != "" {
		if p := filepath.Join(repoRoot, "scripts", "kafka", "log4j2.yaml"); fileExists(p) {
			b.KafkaLog4j = p
		}
	}
	if len(missing) > 0 {
		return b, fmt.Errorf("%w: %s", ErrMissing, strings.Join(missing, "; "))
	}
	return b, nil
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// findKafkaLibs looks for CACHE/kafka/<version>/libs/.complete (what
// scripts/services install kafka leaves), CACHE being SERVICES_CACHE_DIR or
// the repository's .cache; the newest version wins.
func findKafkaLibs(repoRoot string) string {
	var caches []string
	if c := os.Getenv("SERVICES_CACHE_DIR"); c != "" {
		caches = append(caches, c)
	}
	if repoRoot != "" {
		caches = append(caches, filepath.Join(repoRoot, ".cache"))
	}
	for _, c := range caches {
		dirs, _ := filepath.Glob(filepath.Join(c, "kafka", "*", "libs"))
		sort.Slice(dirs, func(i, j int) bool {
			return versionLess(filepath.Base(filepath.Dir(dirs[j])), filepath.Base(filepath.Dir(dirs[i])))
		})
		for _, d := range dirs {
			if fileExists(filepath.Join(d, ".complete")) {
				return d
			}
		}
	}
	return ""
}

func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		x, _ := strconv.Atoi(as[i])
		y, _ := strconv.Atoi(bs[i])
		if x != y {
			return x < y
		}
	}
	return len(as) < len(bs)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

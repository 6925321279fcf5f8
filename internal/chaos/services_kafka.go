package chaos

// The verifier's single-node KRaft Kafka broker.

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

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

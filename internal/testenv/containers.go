package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Containers are started once per test binary and reaped by testcontainers'
// Ryuk when the binary exits.
var (
	pgOnce, redisOnce, kafkaOnce sync.Once
	pgURL, redisURL, kafkaAddr   string
	pgErr, redisErr, kafkaErr    error
)

var errNoDocker = errors.New("no Docker engine answers")

func dockerAnswers(ctx context.Context) error {
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return errNoDocker
	}
	defer p.Close()
	if err := p.Health(ctx); err != nil {
		return errNoDocker
	}
	return nil
}

func containerPostgres() (string, error) {
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if pgErr = dockerAnswers(ctx); pgErr != nil {
			return
		}
		c, err := tcpostgres.Run(ctx, "postgres:15-alpine",
			tcpostgres.WithDatabase("coordinator_test"), tcpostgres.WithUsername("postgres"),
			tcpostgres.WithPassword("postgres"), tcpostgres.BasicWaitStrategies())
		if err != nil {
			pgErr = err
			return
		}
		pgURL, pgErr = c.ConnectionString(ctx, "sslmode=disable")
	})
	return pgURL, pgErr
}

func containerRedis() (string, error) {
	redisOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if redisErr = dockerAnswers(ctx); redisErr != nil {
			return
		}
		c, err := tcredis.Run(ctx, "redis:7-alpine")
		if err != nil {
			redisErr = err
			return
		}
		redisURL, redisErr = c.ConnectionString(ctx)
	})
	return redisURL, redisErr
}

func containerKafka() (string, error) {
	kafkaOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if kafkaErr = dockerAnswers(ctx); kafkaErr != nil {
			return
		}
		// Apache Kafka's own image in KRaft mode. The advertised listener must
		// name the host port, so the port is chosen here and bound fixed.
		port, err := freePort()
		if err != nil {
			kafkaErr = err
			return
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		_, err = testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
			Started: true,
			ContainerRequest: testcontainers.ContainerRequest{
				Image:        "apache/kafka:4.1.0",
				ExposedPorts: []string{fmt.Sprintf("%d:9092/tcp", port)},
				Env: map[string]string{
					"KAFKA_NODE_ID":                                  "1",
					"KAFKA_PROCESS_ROLES":                            "broker,controller",
					"KAFKA_LISTENERS":                                "PLAINTEXT://:9092,CONTROLLER://:9093",
					"KAFKA_ADVERTISED_LISTENERS":                     "PLAINTEXT://" + addr,
					"KAFKA_CONTROLLER_LISTENER_NAMES":                "CONTROLLER",
					"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":           "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
					"KAFKA_CONTROLLER_QUORUM_VOTERS":                 "1@localhost:9093",
					"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":         "1",
					"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
					"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":            "1",
					"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":         "0",
					"KAFKA_NUM_PARTITIONS":                           "3",
				},
				WaitingFor: wait.ForLog("Kafka Server started").WithStartupTimeout(2 * time.Minute),
			},
		})
		if err != nil {
			kafkaErr = err
			return
		}
		kafkaAddr = addr
	})
	return kafkaAddr, kafkaErr
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

package telemetry

import (
	"runtime"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// BuildInfo is coordinator_build_info{version, revision, go_version} = 1:
// what is deployed, joinable onto any other series by instance.
func BuildInfo(version, revision string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "coordinator_build_info",
		Help:        "The running build: version, VCS revision and Go version (value 1).",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "go_version": runtime.Version()},
	})
	g.Set(1)
	return g
}

// statCollector turns a snapshot function into const metrics at scrape.
type statCollector struct {
	descs   []*prometheus.Desc
	collect func(ch chan<- prometheus.Metric)
}

func (c *statCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *statCollector) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }

// PgxPoolCollector exports pool.Stat() at each scrape (coordinator_pgxpool_*).
func PgxPoolCollector(pool *pgxpool.Pool) prometheus.Collector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	var (
		acquired     = d("coordinator_pgxpool_acquired_connections", "Postgres connections in use.")
		idle         = d("coordinator_pgxpool_idle_connections", "Idle Postgres connections in the pool.")
		constructing = d("coordinator_pgxpool_constructing_connections", "Postgres connections being opened.")
		total        = d("coordinator_pgxpool_total_connections", "Postgres connections in the pool (acquired, idle, constructing).")
		maxConns     = d("coordinator_pgxpool_max_connections", "The pool's connection limit.")
		acquires     = d("coordinator_pgxpool_acquires_total", "Successful connection acquisitions.")
		acquireSecs  = d("coordinator_pgxpool_acquire_seconds_total", "Time spent acquiring connections.")
		empty        = d("coordinator_pgxpool_empty_acquires_total", "Acquisitions that had to wait: the pool had no idle connection.")
		emptyWait    = d("coordinator_pgxpool_empty_acquire_wait_seconds_total", "Time spent waiting in acquisitions that found the pool empty.")
		canceled     = d("coordinator_pgxpool_canceled_acquires_total", "Acquisitions cancelled by their context.")
		newConns     = d("coordinator_pgxpool_new_connections_total", "Connections opened.")
		lifetime     = d("coordinator_pgxpool_max_lifetime_destroys_total", "Connections closed for reaching their maximum lifetime.")
		idleDestroy  = d("coordinator_pgxpool_max_idle_destroys_total", "Connections closed for idling too long.")
	)
	return &statCollector{
		descs: []*prometheus.Desc{acquired, idle, constructing, total, maxConns, acquires, acquireSecs, empty, emptyWait,
			canceled, newConns, lifetime, idleDestroy},
		collect: func(ch chan<- prometheus.Metric) {
			s := pool.Stat()
			g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
			c := func(d *prometheus.Desc, v float64) {
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
			}
			g(acquired, float64(s.AcquiredConns()))
			g(idle, float64(s.IdleConns()))
			g(constructing, float64(s.ConstructingConns()))
			g(total, float64(s.TotalConns()))
			g(maxConns, float64(s.MaxConns()))
			c(acquires, float64(s.AcquireCount()))
			c(acquireSecs, s.AcquireDuration().Seconds())
			c(empty, float64(s.EmptyAcquireCount()))
			c(emptyWait, s.EmptyAcquireWaitTime().Seconds())
			c(canceled, float64(s.CanceledAcquireCount()))
			c(newConns, float64(s.NewConnsCount()))
			c(lifetime, float64(s.MaxLifetimeDestroyCount()))
			c(idleDestroy, float64(s.MaxIdleDestroyCount()))
		},
	}
}

// RedisPoolCollector exports the go-redis client's PoolStats() at each
// scrape (coordinator_redis_pool_*; a cluster client sums its nodes').
func RedisPoolCollector(client interface{ PoolStats() *redis.PoolStats }) prometheus.Collector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	var (
		hits     = d("coordinator_redis_pool_hits_total", "Times a free Redis connection was found in the pool.")
		misses   = d("coordinator_redis_pool_misses_total", "Times no free Redis connection was in the pool (a new one was dialled or waited for).")
		timeouts = d("coordinator_redis_pool_timeouts_total", "Times waiting for a Redis connection timed out.")
		waits    = d("coordinator_redis_pool_waits_total", "Times a Redis command waited for a connection.")
		waitSecs = d("coordinator_redis_pool_wait_seconds_total", "Time spent waiting for Redis connections.")
		total    = d("coordinator_redis_pool_connections", "Redis connections in the pool.")
		idle     = d("coordinator_redis_pool_idle_connections", "Idle Redis connections in the pool.")
		stale    = d("coordinator_redis_pool_stale_connections_total", "Stale Redis connections removed from the pool.")
	)
	return &statCollector{
		descs: []*prometheus.Desc{hits, misses, timeouts, waits, waitSecs, total, idle, stale},
		collect: func(ch chan<- prometheus.Metric) {
			s := client.PoolStats()
			g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
			c := func(d *prometheus.Desc, v float64) {
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
			}
			c(hits, float64(s.Hits))
			c(misses, float64(s.Misses))
			c(timeouts, float64(s.Timeouts))
			c(waits, float64(s.WaitCount))
			c(waitSecs, float64(s.WaitDurationNs)/1e9)
			g(total, float64(s.TotalConns))
			g(idle, float64(s.IdleConns))
			c(stale, float64(s.StaleConns))
		},
	}
}

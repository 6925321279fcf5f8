package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	// The toxics register themselves (latency, bandwidth, timeout, ...).
	_ "github.com/Shopify/toxiproxy/v2/toxics"
)

// The network between every process and its dependencies: an embedded
// Toxiproxy (the library, no server of its own) with one TCP proxy per
// link, so a fault can hit one process and one dependency. A host is a
// replica slot (r1, r2, ...: every incarnation of the slot uses the same
// proxies), a `coordinator lock` worker (lw0, ...: every process of the
// worker) or an in-process Locker worker (iw0, ...).
//
// How each dependency is routed through a host's proxies:
//   - PostgreSQL: the host's DSN names its proxy.
//   - Redis (Sentinel mode): the sentinel answers with the nodes' real
//     addresses, so the coordinator's test hook COORDINATOR_TEST_REDIS_ADDR_MAP
//     (testhooks builds only) dials every real address at the host's proxy
//     of it; the in-process workers' own go-redis client does the same.
//   - Kafka: clients connect to the address the broker advertises in its
//     metadata, so the broker has one listener per replica slot, each
//     advertising the slot's proxy (whose upstream is that listener): a
//     replica's seed and every broker connection after it go through its
//     own proxy.

// Dependencies a link leads to.
const (
	depRedis    = "redis"
	depPostgres = "postgres"
	depKafka    = "kafka"
)

// netLayer owns the proxies.
type netLayer struct {
	srv *toxiproxy.ApiServer

	mu    sync.Mutex
	links []*netLink
	seq   int
}

// netLink is one proxy: a host's connection to one server.
type netLink struct {
	host string // r1, lw0, iw2
	dep  string // depRedis, depPostgres, depKafka
	name string // the server: postgres, kafka, sentinel, redis-0, redis-1
	// upstream is the server's real address.
	upstream string
	proxy    *toxiproxy.Proxy
	listen   string

	mu     sync.Mutex
	toxics []string // names of the toxics in place
}

func newNetLayer() *netLayer {
	// Toxiproxy's toxics log through zerolog's global logger (at trace
	// level); the verifier has nothing to learn from them.
	zerolog.SetGlobalLevel(zerolog.Disabled)
	return &netLayer{srv: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())}
}

// add starts a proxy for host to upstream on a free loopback port.
func (n *netLayer) add(host, dep, name, upstream string) (*netLink, error) {
	p := toxiproxy.NewProxy(n.srv, host+"/"+name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("proxy %s/%s: %w", host, name, err)
	}
	l := &netLink{host: host, dep: dep, name: name, upstream: upstream, proxy: p, listen: p.Listen}
	n.mu.Lock()
	n.links = append(n.links, l)
	n.mu.Unlock()
	return l, nil
}

// addr is where the host dials instead of the upstream.
func (l *netLink) addr() string { return l.listen }

// hostLinks returns host's links to dep ("" = every dependency).
func (n *netLayer) hostLinks(host, dep string) []*netLink {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []*netLink
	for _, l := range n.links {
		if l.host == host && (dep == "" || l.dep == dep) {
			out = append(out, l)
		}
	}
	return out
}

// deps lists the dependencies host has links to, in a fixed order.
func (n *netLayer) deps(host string) []string {
	seen := map[string]bool{}
	for _, l := range n.hostLinks(host, "") {
		seen[l.dep] = true
	}
	var out []string
	for _, d := range []string{depRedis, depPostgres, depKafka} {
		if seen[d] {
			out = append(out, d)
		}
	}
	return out
}

// addrMap is the host's Redis address map for COORDINATOR_TEST_REDIS_ADDR_MAP
// ("real=proxy,..."), sorted.
func (n *netLayer) addrMap(host string) string {
	var pairs []string
	for _, l := range n.hostLinks(host, depRedis) {
		pairs = append(pairs, l.upstream+"="+l.addr())
	}
	sort.Strings(pairs)
	return strings.Join(pairs, ",")
}

// dialMap is the same map for an in-process client.
func (n *netLayer) dialMap(host string) map[string]string {
	m := map[string]string{}
	for _, l := range n.hostLinks(host, depRedis) {
		m[l.upstream] = l.addr()
	}
	return m
}

// toxic is one Toxiproxy toxic: its type, the direction it acts on
// ("upstream": client to server, "downstream": server to client) and its
// attributes.
type toxic struct {
	typ    string
	stream string
	attrs  map[string]any
}

// apply adds the toxics to every link and returns their names.
func (n *netLayer) apply(links []*netLink, ts []toxic) error {
	for _, l := range links {
		for _, t := range ts {
			n.mu.Lock()
			n.seq++
			name := fmt.Sprintf("chaos-%d-%s-%s", n.seq, t.typ, t.stream)
			n.mu.Unlock()
			body, _ := json.Marshal(map[string]any{"name": name, "type": t.typ, "stream": t.stream, "toxicity": 1.0, "attributes": t.attrs})
			if _, err := l.proxy.Toxics.AddToxicJson(bytes.NewReader(body)); err != nil {
				return fmt.Errorf("%s/%s: toxic %s: %w", l.host, l.name, t.typ, err)
			}
			l.mu.Lock()
			l.toxics = append(l.toxics, name)
			l.mu.Unlock()
		}
	}
	return nil
}

// heal removes every toxic of the links and, with reset, closes the
// connections that went through them: data a toxic dropped leaves a
// protocol stream the two ends no longer agree on, as a real partition
// longer than the peers' timeouts does (they reset the connection).
func (n *netLayer) heal(links []*netLink, reset bool) error {
	var errs []string
	for _, l := range links {
		l.mu.Lock()
		names := l.toxics
		l.toxics = nil
		l.mu.Unlock()
		for _, name := range names {
			if err := l.proxy.Toxics.RemoveToxic(context.Background(), name); err != nil {
				errs = append(errs, fmt.Sprintf("%s/%s: remove %s: %v", l.host, l.name, name, err))
			}
		}
		if reset {
			if err := l.reset(); err != nil {
				errs = append(errs, err.Error())
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// reset closes every connection through the proxy: it stops it and starts
// it again on the same port (retried: the port is free for a moment).
func (l *netLink) reset() error {
	l.proxy.Stop()
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if err = l.proxy.Start(); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s/%s: restart proxy on %s: %w", l.host, l.name, l.listen, err)
}

// healAll removes every toxic left anywhere (end of the fault phase).
func (n *netLayer) healAll() error {
	n.mu.Lock()
	var dirty []*netLink
	for _, l := range n.links {
		l.mu.Lock()
		if len(l.toxics) > 0 {
			dirty = append(dirty, l)
		}
		l.mu.Unlock()
	}
	n.mu.Unlock()
	return n.heal(dirty, true)
}

// close stops every proxy.
func (n *netLayer) close() {
	n.mu.Lock()
	links := n.links
	n.mu.Unlock()
	for _, l := range links {
		l.proxy.Stop()
	}
}

package chaos

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// echoServer answers every line with the same line, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip writes a line on c and reads it back within d.
func roundTrip(c net.Conn, d time.Duration) error {
	if err := c.SetDeadline(time.Now().Add(d)); err != nil {
		return err
	}
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_, err := bufio.NewReader(c).ReadString('\n')
	return err
}

// A host's proxy carries its traffic; a partition drops it both ways (the
// connection stays open, nothing arrives); healing resets the connections
// that went through it and lets new ones through. The other host's link is
// untouched throughout.
func TestNetLayerPartitionAndHeal(t *testing.T) {
	upstream := echoServer(t)
	n := newNetLayer()
	t.Cleanup(n.close)
	a, err := n.add("r1", depPostgres, "postgres", upstream)
	require.NoError(t, err)
	b, err := n.add("r2", depPostgres, "postgres", upstream)
	require.NoError(t, err)
	require.Equal(t, []string{depPostgres}, n.deps("r1"))

	ca, err := net.Dial("tcp", a.addr())
	require.NoError(t, err)
	defer ca.Close()
	cb, err := net.Dial("tcp", b.addr())
	require.NoError(t, err)
	defer cb.Close()
	require.NoError(t, roundTrip(ca, 5*time.Second))

	ts, what, reset := netToxics(FaultSpec{Kind: FaultPartitionPostgres})
	require.True(t, reset)
	require.Contains(t, what, "partition")
	require.NoError(t, n.apply(n.hostLinks("r1", depPostgres), ts))
	var ne net.Error
	require.ErrorAs(t, roundTrip(ca, 300*time.Millisecond), &ne, "nothing gets through a partition")
	require.True(t, ne.Timeout(), "the connection hangs, it is not refused: %v", ne)
	require.NoError(t, roundTrip(cb, 5*time.Second), "another host's link is not cut")

	require.NoError(t, n.heal(n.hostLinks("r1", ""), reset))
	require.Error(t, roundTrip(ca, 5*time.Second), "a connection through the partition is reset when it heals")
	c2, err := net.Dial("tcp", a.addr())
	require.NoError(t, err)
	defer c2.Close()
	require.NoError(t, roundTrip(c2, 5*time.Second), "a new connection goes through")
	require.NoError(t, n.healAll(), "nothing left to heal")
}

// Latency is added to round trips without losing data; once it is removed,
// round trips are fast again on the same connection.
func TestNetLayerLatency(t *testing.T) {
	upstream := echoServer(t)
	n := newNetLayer()
	t.Cleanup(n.close)
	l, err := n.add("iw0", depRedis, "redis-0", upstream)
	require.NoError(t, err)
	c, err := net.Dial("tcp", l.addr())
	require.NoError(t, err)
	defer c.Close()
	ts, _, reset := netToxics(FaultSpec{Kind: FaultLatency, Latency: 400 * time.Millisecond, Jitter: 10 * time.Millisecond})
	require.False(t, reset)
	require.NoError(t, n.apply([]*netLink{l}, ts))
	start := time.Now()
	require.NoError(t, roundTrip(c, 10*time.Second))
	require.GreaterOrEqual(t, time.Since(start), 350*time.Millisecond, "the round trip carries the latency")
	require.NoError(t, n.heal([]*netLink{l}, reset))
	require.NoError(t, roundTrip(c, 10*time.Second), "the connection survives a latency fault")
}

// The Redis address map names every Redis link of a host, real=proxy.
func TestNetLayerAddrMap(t *testing.T) {
	n := newNetLayer()
	t.Cleanup(n.close)
	s, err := n.add("lw0", depRedis, "sentinel", "127.0.0.1:1")
	require.NoError(t, err)
	m, err := n.add("lw0", depRedis, "redis-0", "127.0.0.1:2")
	require.NoError(t, err)
	_, err = n.add("lw1", depRedis, "redis-0", "127.0.0.1:2")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:1="+s.addr()+",127.0.0.1:2="+m.addr(), n.addrMap("lw0"))
	require.Equal(t, map[string]string{"127.0.0.1:1": s.addr(), "127.0.0.1:2": m.addr()}, n.dialMap("lw0"))
}

package redislock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The send path. Every script call of the Locker goes through do: it sends
// each call to the master of its key's slot, pipelined with the other calls
// for that master and, where replicas must acknowledge, followed by WAIT on
// the same connection (WAIT counts the writes of its own connection; those
// go through the node's client, the others through the client itself, so
// that its hooks see them). The answers that say a script did not run are
// handled here:
//
//   - MOVED: the slot has moved; the call goes to the named master (and the
//     client's slot map is reloaded);
//   - ASK: the slot is migrating and the key is not on its master; the call
//     goes to the importing master, after ASKING, with its WAIT there;
//   - NOSCRIPT: the node lacks the script (restarted, flushed, or a new
//     node); the call is sent again as EVAL;
//   - TRYAGAIN (a multi-key script while its keys are split between the two
//     masters of a migrating slot), CLUSTERDOWN, LOADING: the call is sent
//     again after a backoff, until the caller's context ends. Until then
//     the answer is unknown, never "not held".
//
// Everything else (a script's own answer, a network error after go-redis'
// own retry) is the call's outcome. A script that may have run is never
// sent to a second node: the answers above all come before it runs.

// call is one script call: what to send, and what came back.
type call struct {
	script *redis.Script
	keys   []string // keys[0] routes the call (all share its slot)
	args   []any
	// ack: the required replicas must acknowledge this call's writes.
	ack bool

	cmd *redis.Cmd // the answer of the send that counted
	// err is cmd's error, or why the call was never answered.
	err error
	// acked is nil, or why the replicas did not acknowledge (ErrUnreplicated,
	// wrapped): the script ran on the master only.
	acked error
	// sent is when the send that counted was made (for a trust deadline).
	sent time.Time

	// Routing: addr is a redirect target ("" = the slot's master), asking
	// that the target is importing the slot.
	addr   string
	asking bool
	eval   bool // send EVAL, not EVALSHA
	hops   int
}

func newCall(s *redis.Script, ack bool, keys []string, args ...any) *call {
	return &call{script: s, keys: keys, args: args, ack: ack}
}

// maxHops bounds the redirects one call follows (a slot map that
// contradicts itself would otherwise bounce it forever).
const maxHops = 16

// retryBudget bounds the resends after TRYAGAIN (and the like) of a call
// whose context has no deadline.
const retryBudget = 5 * time.Second

// do sends calls and returns when each has its outcome.
func (l *Locker) do(ctx context.Context, calls ...*call) {
	until, ok := ctx.Deadline()
	if !ok {
		until = time.Now().Add(retryBudget)
	}
	l.doUntil(ctx, until, calls)
}

// doUntil sends pending until each has its outcome. Calls for several
// nodes go side by side, each node's with resends of their own (NOSCRIPT,
// MOVED, TRYAGAIN): a node that stops answering holds up only its own
// calls, and a renewal round's leases on the other masters are renewed in
// time.
func (l *Locker) doUntil(ctx context.Context, until time.Time, pending []*call) {
	for attempt := 0; len(pending) > 0; attempt++ {
		groups := l.route(ctx, pending)
		if len(groups) > 1 {
			var wg sync.WaitGroup
			for _, g := range groups {
				wg.Add(1)
				go func() {
					defer wg.Done()
					l.doUntil(ctx, until, g.calls)
				}()
			}
			wg.Wait()
			return
		}
		var now, later []*call
		for _, g := range groups {
			l.pipe(ctx, g)
			for _, c := range g.calls {
				switch redirect(c) {
				case resendNow:
					now = append(now, c)
				case resendLater:
					later = append(later, c)
				}
			}
		}
		if len(later) > 0 && !sleep(ctx, until, backoff(attempt)) {
			later = nil // each keeps its last answer (TRYAGAIN, ...)
		}
		pending = append(now, later...)
	}
}

type resend int

const (
	done resend = iota
	resendNow
	resendLater
)

// redirect reads c's answer: its outcome (done), or where and when to send
// it again.
func redirect(c *call) resend {
	err := c.err
	if err == nil {
		return done
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return done // not an answer from Redis: the script may have run
	}
	msg := rerr.Error()
	word, rest, _ := strings.Cut(msg, " ")
	switch word {
	case "MOVED", "ASK":
		c.hops++
		if c.hops > maxHops {
			c.err = fmt.Errorf("redislock: %d redirects, the last: %w", c.hops-1, err)
			return done
		}
		// "MOVED <slot> <host:port>"
		_, addr, ok := strings.Cut(rest, " ")
		if !ok || addr == "" {
			return done
		}
		c.addr, c.asking = addr, word == "ASK"
		return resendNow
	case "NOSCRIPT":
		if c.eval {
			return done
		}
		c.eval = true
		return resendNow
	case "TRYAGAIN", "CLUSTERDOWN", "LOADING":
		// From the slot's master again: the migration may be over.
		c.addr, c.asking = "", false
		return resendLater
	}
	return done
}

// backoff before the attempt-th resend of calls Redis said to try again:
// 5ms doubling to 100ms, with jitter, so that a waiter acquires soon after
// a migration ends without hammering the masters meanwhile.
func backoff(attempt int) time.Duration {
	d := min(5*time.Millisecond<<min(attempt, 5), 100*time.Millisecond)
	return d/2 + rand.N(d/2+1)
}

// sleep waits d, unless that ends past until or ctx ends first (false).
func sleep(ctx context.Context, until time.Time, d time.Duration) bool {
	if time.Until(until) < d {
		return false
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

// group is the calls going to one node in one pipeline.
type group struct {
	node  *redis.Client // nil: l.client is neither a Client nor a ClusterClient
	addr  string        // the node's address ("" outside a cluster)
	calls []*call
}

// route groups calls by the node each goes to. A call whose node cannot be
// found gets that error as its outcome.
func (l *Locker) route(ctx context.Context, calls []*call) []*group {
	if c, ok := l.client.(*redis.Client); ok {
		return []*group{{node: c, calls: calls}} // one node
	}
	var groups []*group
	byAddr := map[string]*group{}
	for _, c := range calls {
		var node *redis.Client
		var addr string
		switch cl := l.client.(type) {
		case *redis.ClusterClient:
			var err error
			if c.addr != "" {
				node, err = l.nodeAt(ctx, cl, c)
			} else {
				node, err = cl.MasterForKey(ctx, c.keys[0])
			}
			if err != nil {
				c.err = err
				continue
			}
			addr = node.Options().Addr
		case *redis.Client:
			node = cl
		}
		g := byAddr[addr]
		if g == nil || g.node != node {
			g = &group{node: node, addr: addr}
			byAddr[addr] = g
			groups = append(groups, g)
		}
		g.calls = append(g.calls, c)
	}
	return groups
}

// pipe sends g's calls, followed by WAIT where replicas must acknowledge
// any of them, and records each call's outcome. Calls that other
// goroutines send to the same target meanwhile go in the same pipeline
// (coalesce.go).
func (l *Locker) pipe(ctx context.Context, g *group) {
	if g.node == nil {
		l.run(ctx, g.calls)
		return
	}
	need := 0
	for _, c := range g.calls {
		if c.ack {
			n, err := l.need(ctx, g.node, g.addr)
			if err != nil {
				for _, c := range g.calls {
					c.err = err
				}
				return
			}
			need = n
			break
		}
	}
	// Without WAIT and without a redirect of the Locker's own, the calls go
	// through the client itself (a cluster client routes them, and follows
	// MOVED and ASK on its own, up to its MaxRedirects): its hooks see them,
	// a call alone as one command, several as a pipeline. WAIT must follow
	// the writes on their connection, and a redirect goes to a node the
	// client may not map yet: those go through the node's client.
	t := target{client: l.client, node: g.node, addr: g.addr}
	if l.cluster {
		// One queue per master also here: a stalled master's calls must not
		// fill the pipelines that the other masters' calls wait for.
		t.key = "client " + g.addr
	}
	if need > 0 {
		t.client, t.key = g.node, "node "+g.addr
	} else {
		for _, c := range g.calls {
			if c.addr != "" {
				t.client, t.key = g.node, "node "+g.addr
			}
		}
	}
	l.submit(ctx, t, need, g.calls)
}

// target is where a pipeline goes: the client it is sent on, and the node
// (and its address) whose replicas a WAIT counts. key names its batcher
// ("" for a single node's client itself; on a cluster, one per master).
type target struct {
	key    string
	client redis.UniversalClient
	node   *redis.Client
	addr   string
}

// send sends calls on t in one pipeline (a call alone as one command),
// followed by WAIT for need replicas when need > 0, and records each
// call's outcome.
func (l *Locker) send(ctx context.Context, t target, need int, calls []*call) {
	if len(calls) == 1 && need == 0 && !calls[0].asking {
		c := calls[0]
		c.sent = time.Now()
		if c.eval {
			c.cmd = c.script.Eval(ctx, t.client, c.keys, c.args...)
		} else {
			c.cmd = c.script.EvalSha(ctx, t.client, c.keys, c.args...)
		}
		c.err, c.acked = c.cmd.Err(), nil
		return
	}
	pipe := t.client.Pipeline()
	for _, c := range calls {
		if c.asking {
			pipe.Do(ctx, "asking")
		}
		if c.eval {
			c.cmd = c.script.Eval(ctx, pipe, c.keys, c.args...)
		} else {
			c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
		}
	}
	var w *redis.Cmd
	if need > 0 {
		w = pipe.Do(ctx, "wait", need, l.cfg.ReplicaTimeout.Milliseconds())
	}
	sent := time.Now()
	_, _ = pipe.Exec(ctx)
	var ackErr error
	if w != nil {
		ackErr = l.checkAcked(ctx, t.node, t.addr, need, w)
	}
	for _, c := range calls {
		c.err, c.sent, c.acked = c.cmd.Err(), sent, nil
		if c.err == nil && c.ack {
			c.acked = ackErr
		}
	}
}

// run sends calls one by one on a client that is neither a Client nor a
// ClusterClient (go-redis routes them); it cannot WAIT.
func (l *Locker) run(ctx context.Context, calls []*call) {
	for _, c := range calls {
		c.sent = time.Now()
		c.cmd = c.script.Run(ctx, l.client, c.keys, c.args...)
		c.err, c.acked = c.cmd.Err(), nil
		if c.err == nil && c.ack && l.cfg.WaitReplicas > 0 {
			c.acked = fmt.Errorf("%w: WAIT needs a *redis.Client or *redis.ClusterClient, got %T", ErrUnreplicated, l.client)
		}
	}
}

// need is how many replicas must acknowledge a write to the master at addr
// (node). In auto mode a master not seen yet (the target of a redirect) is
// asked first; one that refuses INFO gets no WAIT.
func (l *Locker) need(ctx context.Context, node *redis.Client, addr string) (int, error) {
	switch {
	case l.cfg.WaitReplicas == ReplicasNone:
		return 0, nil
	case l.cfg.WaitReplicas > 0:
		return l.cfg.WaitReplicas, nil
	}
	l.srv.mu.Lock()
	n, ok := l.srv.replicas[addr]
	l.srv.mu.Unlock()
	if ok {
		return n, nil
	}
	info, err := node.Info(ctx, "replication").Result()
	var rerr redis.Error
	switch {
	case errors.As(err, &rerr):
		n = 0 // INFO refused: nothing to wait for, as refreshServer says once
	case err != nil:
		return 0, fmt.Errorf("redislock: replicas of %s: %w", addr, err)
	default:
		n = onlineReplicas(infoFields(info))
	}
	l.srv.mu.Lock()
	if l.srv.replicas == nil {
		l.srv.replicas = map[string]int{}
	}
	l.srv.replicas[addr] = n
	l.srv.mu.Unlock()
	return n, nil
}

// redirects are the clients of the nodes redirects name: go-redis does not
// hand out its own node clients by address, so the Locker makes its own,
// with the options of the cluster's node clients, and closes them in Close.
type redirects struct {
	mu     sync.Mutex
	nodes  map[string]*redis.Client
	closed bool
}

// nodeAt is a client of the cluster node at addr, for a call whose key
// redirected it there: go-redis' own client of that node when its slot map
// already names it as the key's master, else one of the Locker's own with
// the options go-redis gave its node clients. A MOVED also has the slot map
// reloaded (in the background), so that the next calls go straight there.
func (l *Locker) nodeAt(ctx context.Context, cc *redis.ClusterClient, c *call) (*redis.Client, error) {
	if !c.asking {
		cc.ReloadState(ctx)
	}
	master, err := cc.MasterForKey(ctx, c.keys[0])
	if err != nil {
		return nil, err
	}
	if master.Options().Addr == c.addr {
		return master, nil
	}
	l.redir.mu.Lock()
	defer l.redir.mu.Unlock()
	if l.redir.closed {
		return nil, errClosed
	}
	if n := l.redir.nodes[c.addr]; n != nil {
		return n, nil
	}
	if l.redir.nodes == nil {
		l.redir.nodes = map[string]*redis.Client{}
	}
	o := *master.Options()
	o.Addr, o.NodeAddress = c.addr, ""
	if o.MaintNotificationsConfig != nil {
		mn := *o.MaintNotificationsConfig
		o.MaintNotificationsConfig = &mn
	}
	n := cc.Options().NewClient(&o)
	l.redir.nodes[c.addr] = n
	return n, nil
}

// closeRedirects closes the Locker's own node clients.
func (l *Locker) closeRedirects() {
	l.redir.mu.Lock()
	defer l.redir.mu.Unlock()
	l.redir.closed = true
	for _, n := range l.redir.nodes {
		_ = n.Close()
	}
	l.redir.nodes = nil
}

// The calls of the scripts that differ by layout (Config.Layout); the
// renew, holds and ttl scripts are the same in both.

// acquireCall: keys lock, fence, queue, tickets.
func (l *Locker) acquireCall(keys []string, token string, ttlMS int64, ticket string) *call {
	if l.cfg.Layout == LayoutRedisson {
		return newCall(acquireRedissonScript, true, keys, token, l.cfg.Owner, ttlMS, ticket)
	}
	return newCall(acquireScript, true, keys, token, l.cfg.Owner, ttlMS, ticket)
}

// releaseCall: keys lock, queue, tickets, ended marker of key.
func (l *Locker) releaseCall(key string, keys []string, token, fence string) *call {
	if l.cfg.Layout == LayoutRedisson {
		return newCall(releaseRedissonScript, false, append(keys, redissonChannel(key)),
			token, fence, l.wakePrefix(), l.shardedArg())
	}
	return newCall(releaseScript, false, keys, token, fence)
}

// leaveCall: keys lock, queue, tickets of key.
func (l *Locker) leaveCall(key string, keys []string) *call {
	if l.cfg.Layout == LayoutRedisson {
		return newCall(leaveRedissonScript, false, append(keys, redissonChannel(key)),
			l.id, l.wakePrefix(), l.shardedArg())
	}
	return newCall(leaveScript, false, keys, l.id)
}

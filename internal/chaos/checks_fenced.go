package chaos

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// KindTwoWritersAccepted: the in-process workers' fenced store accepted a
// holder's write after it had accepted a newer holder's: two writers were
// accepted for one key. With fences strictly increasing per acquisition the
// store refuses the older holder (its fence is below); only a fence handed
// out twice, or one that went backwards, lets it through.
const KindTwoWritersAccepted = "two_writers_accepted"

// checkFencedWrites walks each key's accepted writes in commit order: once
// another holder's write was accepted, no write of an earlier holder may be
// accepted again, and accepted fences never go down (the store's own rule:
// if it breaks, the instrument is broken and nothing it says is trusted).
func checkFencedWrites(h *History) []Anomaly {
	byKey := map[string][]FencedWrite{}
	for _, w := range h.FencedWrites {
		if w.Accepted {
			byKey[w.Key] = append(byKey[w.Key], w)
		}
	}
	var out []Anomaly
	for _, k := range sortedKeys(byKey) {
		ws := byKey[k]
		slices.SortFunc(ws, func(a, b FencedWrite) int { return cmp.Compare(a.ID, b.ID) })
		// closed: holders that a later holder's accepted write superseded,
		// with that write.
		closed := map[string]FencedWrite{}
		reported := map[string]bool{}
		for i, w := range ws {
			if i == 0 {
				continue
			}
			prev := ws[i-1]
			if w.Fence < prev.Fence && !reported["order"] {
				reported["order"] = true
				out = append(out, Anomaly{KindTwoWritersAccepted, fmt.Sprintf(
					"key %s: the fenced store accepted write #%d with fence %d (%s) after write #%d with fence %d (%s): its fence check does not hold",
					k, w.ID, w.Fence, w.Holder, prev.ID, prev.Fence, prev.Holder)})
			}
			if prev.Holder != w.Holder {
				if _, ok := closed[prev.Holder]; !ok {
					closed[prev.Holder] = w
				}
			}
			if by, ok := closed[w.Holder]; ok && !reported[w.Holder] {
				reported[w.Holder] = true
				out = append(out, Anomaly{KindTwoWritersAccepted, fmt.Sprintf(
					"key %s: %s's write #%d (fence %d, committed %s) was accepted after %s's write #%d (fence %d, committed %s): two holders' writes interleaved in the store; fences equal or going backwards let the older holder back in",
					k, w.Holder, w.ID, w.Fence, w.CommittedAt.Format("15:04:05.000"), by.Holder, by.ID, by.Fence, by.CommittedAt.Format("15:04:05.000"))})
			}
		}
	}
	return out
}

// checkInprocFences: fences strictly increase with the in-process
// workers' acquisitions. B's acquisition surely came after A's when B called
// Acquire after A's Acquire had returned; then B's fence must be above A's.
func checkInprocFences(h *History) []Anomaly {
	byKey := map[string][]InprocSection{}
	for _, s := range h.Inproc {
		byKey[s.Key] = append(byKey[s.Key], s)
	}
	var out []Anomaly
	for _, k := range sortedKeys(byKey) {
		calls := slices.Clone(byKey[k])
		slices.SortFunc(calls, func(a, b InprocSection) int { return cmp.Compare(a.CallNS, b.CallNS) })
		acquired := slices.Clone(byKey[k])
		slices.SortFunc(acquired, func(a, b InprocSection) int { return cmp.Compare(a.AcquiredNS, b.AcquiredNS) })
		j := 0
		var top InprocSection
		have := false
		for _, s := range calls {
			for j < len(acquired) && acquired[j].AcquiredNS < s.CallNS {
				if !have || acquired[j].Fence > top.Fence {
					top, have = acquired[j], true
				}
				j++
			}
			if have && s.Fence <= top.Fence && s.Holder != top.Holder {
				out = append(out, Anomaly{KindFenceNotIncreasing, fmt.Sprintf(
					"key %s: in-process %s called Acquire at %s, after %s had acquired with fence %d (at %s), and got fence %d, not above it",
					k, s.Holder, h.rel(s.CallNS), top.Holder, top.Fence, h.rel(top.AcquiredNS), s.Fence)})
			}
		}
	}
	return out
}

// cutOff describes what became of the lease an in-process worker held when
// a partition from Redis (or from everything) longer than the lease cut it
// off: when it learned it had lost it, the first newer holder's accepted
// write, and how its own writes after that went.
type cutOff struct {
	fault      FaultRecord
	holder     InprocSection
	newer      *FencedWrite
	refused    int
	acceptedAf int // accepted after the newer holder's first write (must be 0)
}

func (h *History) cutOffs() []cutOff {
	var out []cutOff
	for _, f := range h.Faults {
		if f.Holder == "" || (f.Spec.Kind != FaultPartitionRedis && f.Spec.Kind != FaultPartitionAll) {
			continue
		}
		var s InprocSection
		found := false
		for _, x := range h.Inproc {
			if x.Holder == f.Holder {
				s, found = x, true
				break
			}
		}
		if !found {
			continue
		}
		c := cutOff{fault: f, holder: s}
		for i, w := range h.FencedWrites {
			if w.Key != s.Key || !w.Accepted || w.Holder == s.Holder || w.Fence <= s.Fence || w.MonoNS < f.StartNS {
				continue
			}
			c.newer = &h.FencedWrites[i]
			break
		}
		for _, w := range h.FencedWrites {
			if w.Holder != s.Holder {
				continue
			}
			if !w.Accepted {
				c.refused++
			} else if c.newer != nil && w.ID > c.newer.ID {
				c.acceptedAf++
			}
		}
		out = append(out, c)
	}
	return out
}

func (c cutOff) String(h *History) string {
	lost := "it released normally"
	if c.holder.LostNS > 0 {
		lost = fmt.Sprintf("it learned its lease was gone at %s", h.rel(c.holder.LostNS))
	}
	newer := "no newer holder wrote during the run"
	if c.newer != nil {
		newer = fmt.Sprintf("%s (fence %d) wrote first at %s", c.newer.Holder, c.newer.Fence, h.rel(c.newer.MonoNS))
	}
	return fmt.Sprintf("%s at %s on %s for %s: %s (fence %d) held %s; %s; %s; its writes refused by the store: %d, accepted after the newer holder's: %d",
		c.fault.Spec.Kind, h.rel(c.fault.StartNS), c.fault.Host, time.Duration(c.fault.EndNS-c.fault.StartNS).Round(100*time.Millisecond),
		c.holder.Holder, c.holder.Fence, c.holder.Key, lost, newer, c.refused, c.acceptedAf)
}

// ownerCutOff is a bill-run owner cut off from Redis (or from everything)
// by a partition while its run went on: the first newer claim of its period
// after the partition began, and how many batches the cut-off owner
// committed after that claim (the batch statement's fence check must refuse
// them all: stale_batch_commit reports each one it let through).
type ownerCutOff struct {
	fault FaultRecord
	fence int64 // the cut-off owner's claim fence
	newer *BillRunChange
	after int
}

func (h *History) ownerCutOffs() []ownerCutOff {
	var out []ownerCutOff
	for _, f := range h.Faults {
		if f.Replica == "" || f.Period == "" || (f.Spec.Kind != FaultPartitionRedis && f.Spec.Kind != FaultPartitionAll) || h.WallStart.IsZero() {
			continue
		}
		began := h.WallStart.Add(time.Duration(f.StartNS - h.StartNS))
		c := ownerCutOff{fault: f}
		for _, l := range h.BillRunLog {
			if l.Period == f.Period && l.Owner == f.Replica && l.Status == "RUNNING" && !l.CommittedAt.After(began) {
				c.fence = l.Fence
			}
		}
		for i, l := range h.BillRunLog {
			if l.Period == f.Period && l.Owner != f.Replica && l.Status == "RUNNING" && l.CommittedAt.After(began) && l.Fence > c.fence {
				c.newer = &h.BillRunLog[i]
				break
			}
		}
		if c.newer != nil {
			for _, b := range h.Batches {
				if b.Period == f.Period && b.Owner == f.Replica && b.CommittedAt.After(c.newer.CommittedAt) {
					c.after++
				}
			}
		}
		out = append(out, c)
	}
	return out
}

func (c ownerCutOff) String(h *History) string {
	newer := "no other replica claimed it meanwhile"
	if c.newer != nil {
		newer = fmt.Sprintf("%s claimed it with fence %d at %s", c.newer.Owner, c.newer.Fence, h.relWall(c.newer.CommittedAt))
	}
	return fmt.Sprintf("%s at %s on %s for %s: %s owned billrun:%s (claim fence %d); %s; its batches committed after that claim: %d",
		c.fault.Spec.Kind, h.rel(c.fault.StartNS), c.fault.Host, time.Duration(c.fault.EndNS-c.fault.StartNS).Round(100*time.Millisecond),
		c.fault.Replica, c.fault.Period, c.fence, newer, c.after)
}

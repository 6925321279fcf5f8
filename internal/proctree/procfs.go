package proctree

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// procStat is what /proc/<pid>/stat tells about a process.
type procStat struct {
	ppid  int
	state byte // R, S, D, T, t, Z, X, ...
}

// readStat parses /proc/<pid>/stat: "pid (comm) state ppid ...". comm may
// contain spaces and parentheses, so the fields start after the last ')'.
func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 || len(f[0]) != 1 {
		return procStat{}, false
	}
	ppid, err := strconv.Atoi(string(f[1]))
	if err != nil {
		return procStat{}, false
	}
	return procStat{ppid: ppid, state: f[0][0]}, true
}

// liveDescendants lists every descendant of root that has not exited
// (zombies are left out: they are dead and only wait to be reaped). It reads
// all of /proc: the parent links are the only record of a tree whose members
// changed group or session.
func liveDescendants(root int) []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	_ = d.Close()
	children := map[int][]int{}
	states := map[int]byte{}
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		st, ok := readStat(pid)
		if !ok {
			continue
		}
		children[st.ppid] = append(children[st.ppid], pid)
		states[pid] = st.state
	}
	var out []int
	queue := []int{root}
	seen := map[int]bool{root: true}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if seen[c] {
				continue
			}
			seen[c] = true
			queue = append(queue, c)
			if s := states[c]; s != 'Z' && s != 'X' {
				out = append(out, c)
			}
		}
	}
	return out
}

// isDescendant reports whether pid's ancestry reaches root.
func isDescendant(root, pid int) bool {
	for range 4096 { // far deeper than any real tree; ends a loop on bad data
		st, ok := readStat(pid)
		if !ok {
			return false
		}
		if st.ppid == root {
			return true
		}
		if st.ppid <= 1 {
			return false
		}
		pid = st.ppid
	}
	return false
}

// signalPid signals one descendant without hitting a stranger that reused
// its pid: it pins the process with a pidfd, checks that the pinned process
// is still in root's tree, and signals through the pidfd. Kernels without
// pidfds (before 5.3) get a plain kill.
func signalPid(root, pid int, sig syscall.Signal) bool {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ENOSYS) {
		return syscall.Kill(pid, sig) == nil
	}
	if err != nil {
		return false // gone already
	}
	defer unix.Close(fd)
	if !isDescendant(root, pid) {
		return false
	}
	return unix.PidfdSendSignal(fd, sig, nil, 0) == nil
}

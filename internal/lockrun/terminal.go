package lockrun

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// terminal is the controlling terminal `coordinator lock` runs on, when its
// standard input is one.
type terminal struct {
	f    *os.File
	pgrp int // the coordinator's own process group
	// mirrorStops: a job-control shell is our parent (same session, another
	// process group). When the command is stopped from the terminal we stop
	// too, so that the shell sees the job stopped and gets the terminal back.
	// Without such a parent a stopped coordinator might never be continued.
	mirrorStops bool
}

// controllingTerminal returns the first of the streams that is our
// controlling terminal, or nil when none is (pipes, files, another session's
// terminal).
func controllingTerminal(stdin io.Reader, stdout, stderr io.Writer) *terminal {
	for _, s := range []any{stdin, stdout, stderr} {
		if f, ok := s.(*os.File); ok {
			if t := asTerminal(f); t != nil {
				return t
			}
		}
	}
	return nil
}

func asTerminal(f *os.File) *terminal {
	fd := int(f.Fd())
	sid, err := unix.IoctlGetInt(fd, unix.TIOCGSID)
	if err != nil {
		return nil
	}
	if mine, err := unix.Getsid(0); err != nil || mine != sid {
		return nil
	}
	t := &terminal{f: f, pgrp: unix.Getpgrp()}
	ppid := os.Getppid()
	psid, err1 := unix.Getsid(ppid)
	ppgrp, err2 := unix.Getpgid(ppid)
	t.mirrorStops = err1 == nil && err2 == nil && psid == sid && ppgrp != t.pgrp
	return t
}

// foreground is the terminal's foreground process group (0 if unknown).
func (t *terminal) foreground() int {
	pg, err := unix.IoctlGetInt(int(t.f.Fd()), unix.TIOCGPGRP)
	if err != nil {
		return 0
	}
	return pg
}

// setForeground makes pgid the foreground group. From the background this
// raises SIGTTOU unless it is ignored; `coordinator lock` ignores it once the
// command runs.
func (t *terminal) setForeground(pgid int) error {
	return unix.IoctlSetPointerInt(int(t.f.Fd()), unix.TIOCSPGRP, pgid)
}

package lockrun

import (
	"io"
	"os"
	"sync"
	"time"
)

// commandIO is the locked command's stdin, stdout and stderr. The given
// streams are passed on when they are files (the real process); other
// readers and writers (an embedding caller, tests) are connected through
// pipes copied in the background.
type commandIO struct {
	files     []*os.File
	childEnds []*os.File // ours to close once the command has them
	ourEnds   []*os.File // closed by finish
	copies    sync.WaitGroup
}

// copyDrain bounds how long finish waits for the output copies after the
// tree is gone (a descriptor passed to a process outside it could keep a
// pipe open forever).
const copyDrain = 2 * time.Second

func commandFiles(stdin io.Reader, stdout, stderr io.Writer) (*commandIO, error) {
	c := &commandIO{}
	in, err := c.input(stdin)
	if err != nil {
		c.started()
		c.finish()
		return nil, err
	}
	c.files = append(c.files, in)
	for _, w := range []io.Writer{stdout, stderr} {
		f, err := c.output(w)
		if err != nil {
			c.started()
			c.finish()
			return nil, err
		}
		c.files = append(c.files, f)
	}
	return c, nil
}

func (c *commandIO) input(r io.Reader) (*os.File, error) {
	if f, ok := r.(*os.File); ok {
		return f, nil
	}
	if r == nil {
		f, err := os.Open(os.DevNull)
		if err == nil {
			c.childEnds = append(c.childEnds, f)
		}
		return f, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	c.childEnds = append(c.childEnds, pr)
	c.ourEnds = append(c.ourEnds, pw)
	go func() { _, _ = io.Copy(pw, r); _ = pw.Close() }() // not waited for: r may never end
	return pr, nil
}

func (c *commandIO) output(w io.Writer) (*os.File, error) {
	if f, ok := w.(*os.File); ok {
		return f, nil
	}
	if w == nil {
		w = io.Discard
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	c.childEnds = append(c.childEnds, pw)
	c.ourEnds = append(c.ourEnds, pr)
	c.copies.Go(func() { _, _ = io.Copy(w, pr) })
	return pw, nil
}

// started closes our copies of the command's ends, so the output copies
// end when the last process of the tree has closed its own.
func (c *commandIO) started() {
	for _, f := range c.childEnds {
		_ = f.Close()
	}
	c.childEnds = nil
}

// finish waits (bounded) for the output copies and closes our ends.
func (c *commandIO) finish() {
	done := make(chan struct{})
	go func() { c.copies.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(copyDrain):
	}
	for _, f := range c.ourEnds {
		_ = f.Close()
	}
}

package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/telco-platform/coordinator/internal/owned"
)

// barRefresh is how often the terminal bar is redrawn.
const barRefresh = 250 * time.Millisecond

// terminalBar shows a run's progress on a terminal as one line redrawn in
// place (`coordinator run` on a TTY, instead of <job>_progress records).
// Everything else the command writes to that terminal (log lines, events)
// goes through Write, which takes the bar off the line first and puts it
// back below, so the two never garble each other.
type terminalBar struct {
	mu    sync.Mutex
	w     io.Writer
	shown string // the bar on the terminal's last line now, "" for none
	width int
}

// stderrBar returns a terminalBar on stderr when it is a terminal.
func stderrBar(stderr io.Writer) *terminalBar {
	f, ok := stderr.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	width, _, err := term.GetSize(int(f.Fd()))
	if err != nil || width <= 0 {
		width = 80
	}
	return &terminalBar{w: f, width: width}
}

func (b *terminalBar) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.shown != "" {
		_, _ = io.WriteString(b.w, "\r\x1b[K")
	}
	n, err := b.w.Write(p)
	if b.shown != "" {
		_, _ = io.WriteString(b.w, b.shown)
	}
	return n, err
}

func (b *terminalBar) draw(line string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(line) > b.width-1 {
		line = line[:max(b.width-1, 0)]
	}
	_, _ = io.WriteString(b.w, "\r\x1b[K"+line)
	b.shown = line
}

// Track redraws the bar until the work returns, then leaves its last state
// on a line of its own.
func (b *terminalBar) Track(run *owned.Run) func() {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(barRefresh)
		defer t.Stop()
		b.draw(renderBar(run.Progress()))
		for {
			select {
			case <-t.C:
				b.draw(renderBar(run.Progress()))
			case <-quit:
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(quit)
			<-done
			b.draw(renderBar(run.Progress()))
			b.mu.Lock()
			_, _ = io.WriteString(b.w, "\n")
			b.shown = ""
			b.mu.Unlock()
		})
	}
}

// renderBar is one line: kind and key, a 30-cell bar, percent, batches,
// rows per second and time left.
func renderBar(p owned.Progress) string {
	const cells = 30
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s [", p.Key)
	if p.Known() {
		full := int(math.Round(p.Percent / 100 * cells))
		sb.WriteString(strings.Repeat("#", full) + strings.Repeat("-", cells-full))
		fmt.Fprintf(&sb, "] %5.1f%% %d/%d batches", p.Percent, p.BatchesCommitted, p.BatchesTotal)
	} else {
		sb.WriteString(strings.Repeat("?", cells))
		fmt.Fprintf(&sb, "]  %d batches", p.BatchesCommitted)
	}
	fmt.Fprintf(&sb, " %s rows/s", humanRate(p.RowsPerSecond))
	if p.ETA >= 0 {
		fmt.Fprintf(&sb, " ETA %s", p.ETA.Round(time.Second))
	}
	return sb.String()
}

func humanRate(r float64) string {
	switch {
	case r >= 1e6:
		return fmt.Sprintf("%.1fM", r/1e6)
	case r >= 1e4:
		return fmt.Sprintf("%.1fk", r/1e3)
	}
	return fmt.Sprintf("%.0f", r)
}

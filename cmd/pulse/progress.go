package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// progressDelay is how long a step runs before its progress line shows:
// a quick step shows nothing.
var progressDelay = time.Second

// progress draws one status line on stderr while a slow step runs —
// "pulse: committing … (3s)" — and erases it when the step ends. It draws
// only on a terminal, so logs and pipes never see it. A nil *progress
// does nothing.
type progress struct {
	w    io.Writer
	mu   sync.Mutex
	step string
	from time.Time
	drew bool
	quit chan struct{}
	done chan struct{}
}

// newProgress returns a progress line on env's stderr, or nil when stderr
// is not a terminal.
func newProgress(env *cliEnv) *progress {
	f, ok := env.stderr.(*os.File)
	if !ok || !isTerminal(f) {
		return nil
	}
	p := &progress{w: f, quit: make(chan struct{}), done: make(chan struct{})}
	go p.loop()
	return p
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), ioctlGetTermios)
	return err == nil
}

// set starts step ("" ends the current one).
func (p *progress) set(step string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
	p.step, p.from = step, time.Now()
}

func (p *progress) clearLocked() {
	if p.drew {
		fmt.Fprint(p.w, "\r\033[K")
		p.drew = false
	}
}

func (p *progress) loop() {
	defer close(p.done)
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.quit:
			return
		case <-t.C:
		}
		p.mu.Lock()
		if p.step != "" {
			if el := time.Since(p.from); el >= progressDelay {
				fmt.Fprintf(p.w, "\r\033[Kpulse: %s (%ds)", p.step, int(el.Seconds()))
				p.drew = true
			}
		}
		p.mu.Unlock()
	}
}

// close erases the line and stops drawing.
func (p *progress) close() {
	if p == nil {
		return
	}
	close(p.quit)
	<-p.done
	p.mu.Lock()
	p.clearLocked()
	p.step = ""
	p.mu.Unlock()
}

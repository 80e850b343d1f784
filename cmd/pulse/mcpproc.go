package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pulse-agent/pulse/sandbox"
)

// mcpProcs is the background processes the MCP client started, ended ones
// included: their output and result stay readable until the server ends
// (the sandbox keeps each log until it closes).
type mcpProcs struct {
	mu   sync.Mutex
	byID map[string]*sandbox.Process
}

func (m *mcpProcs) add(p *sandbox.Process) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byID == nil {
		m.byID = map[string]*sandbox.Process{}
	}
	m.byID[p.ID()] = p
}

func (m *mcpProcs) get(id string) (*sandbox.Process, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.byID[id]
	if p == nil {
		return nil, fmt.Errorf("no process %q was started in this session (list_processes lists them)", id)
	}
	return p, nil
}

func (m *mcpProcs) all() []*sandbox.Process {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*sandbox.Process, 0, len(m.byID))
	for _, p := range m.byID {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StartedAt().Before(out[j].StartedAt()) })
	return out
}

func addProcessTools(srv *mcp.Server, t *mcpTools) {
	mcp.AddTool(srv, &mcp.Tool{Name: "start", Description: "Start a shell script (bash -c) in the background, for a server or a watcher: " +
		"the same policy, limits and timeout as execute, and its writes become a pending transaction when it ends. " +
		"Returns its process_id at once; read what it prints with process_output, end it with kill, reach a port it listens on with expose."}, t.start)
	mcp.AddTool(srv, &mcp.Tool{Name: "process_output", Description: "What a started process printed (stdout and stderr interleaved, scrubbed of secrets) " +
		"from byte offset on (default 0), as far as it has printed now; with wait_seconds, first wait up to that long for more output or the end. " +
		"Call again with next_offset to read only what is new. Once the process has ended, result holds how it ended and its transaction.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, t.processOutput)
	mcp.AddTool(srv, &mcp.Tool{Name: "kill", Description: "End a started process and everything it started; returns once it has ended and its writes are staged, with its result.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true}}, t.kill)
	mcp.AddTool(srv, &mcp.Tool{Name: "send_input", Description: "Write to a started process's standard input; with close, close it afterwards (the process reads end of file)."}, t.sendInput)
	mcp.AddTool(srv, &mcp.Tool{Name: "list_processes", Description: "The processes started in this session, running or ended, oldest first.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, t.listProcesses)
	mcp.AddTool(srv, &mcp.Tool{Name: "expose", Description: "Make a TCP port that a started process listens on (inside the sandbox, on 127.0.0.1) " +
		"reachable from the host: returns the host address (127.0.0.1:PORT) that relays to it. Only ports the policy lists in network.expose are exposed.",
		Annotations: &mcp.ToolAnnotations{IdempotentHint: true}}, t.expose)
}

type startOut struct {
	ProcessID string `json:"process_id"`
	Command   string `json:"command"`
	StartedAt string `json:"started_at" jsonschema:"RFC 3339"`
}

func (t *mcpTools) start(ctx context.Context, _ *mcp.CallToolRequest, in executeIn) (*mcp.CallToolResult, startOut, error) {
	cmd, err := in.command()
	if err != nil {
		return nil, startOut{}, err
	}
	p, err := t.sb.Start(ctx, cmd)
	if err != nil {
		return nil, startOut{}, mcpRefusal(t.sb, err)
	}
	t.procs.add(p)
	return nil, startOut{ProcessID: p.ID(), Command: p.Command(), StartedAt: p.StartedAt().UTC().Format(time.RFC3339Nano)}, nil
}

type processIn struct {
	ProcessID string `json:"process_id"`
}

type outputIn struct {
	ProcessID   string  `json:"process_id"`
	Offset      int64   `json:"offset,omitempty" jsonschema:"byte offset to read from (default 0: from the start); pass the next_offset of the previous call to read only what is new"`
	WaitSeconds float64 `json:"wait_seconds,omitempty" jsonschema:"wait up to this many seconds (at most 60) for output past offset or for the end, then return what there is"`
}

type outputOut struct {
	ProcessID  string      `json:"process_id"`
	Output     string      `json:"output"`
	Encoding   string      `json:"encoding" jsonschema:"utf-8, or base64 for output that is not valid UTF-8"`
	Offset     int64       `json:"offset"`
	NextOffset int64       `json:"next_offset" jsonschema:"offset of the first byte not returned"`
	More       bool        `json:"more" jsonschema:"true when more output is already there past next_offset (this call returned at most 1 MiB)"`
	Running    bool        `json:"running"`
	Result     *executeOut `json:"result,omitempty" jsonschema:"how the process ended, once it has"`
}

// mcpOutputChunk bounds what one process_output call returns.
const mcpOutputChunk = 1 << 20

func (t *mcpTools) processOutput(ctx context.Context, _ *mcp.CallToolRequest, in outputIn) (*mcp.CallToolResult, outputOut, error) {
	p, err := t.procs.get(in.ProcessID)
	if err != nil {
		return nil, outputOut{}, err
	}
	if in.Offset < 0 {
		return nil, outputOut{}, fmt.Errorf("offset must not be negative, got %d", in.Offset)
	}
	if in.WaitSeconds < 0 || in.WaitSeconds > 60 || in.WaitSeconds != in.WaitSeconds {
		return nil, outputOut{}, fmt.Errorf("wait_seconds must be between 0 and 60, got %v", in.WaitSeconds)
	}
	if in.WaitSeconds > 0 {
		waitForOutput(ctx, p, in.Offset, time.Duration(in.WaitSeconds*float64(time.Second)))
	}
	// Whether it ended is read before the size: an ended process's log is
	// complete, so nothing printed goes unread behind running=false.
	ended := isDone(p)
	size := p.OutputSize()
	out := outputOut{ProcessID: p.ID(), Encoding: "utf-8", Offset: in.Offset, NextOffset: in.Offset, Running: !ended}
	if in.Offset < size {
		n := min(size-in.Offset, mcpOutputChunk)
		r := p.Output(in.Offset)
		buf := make([]byte, n)
		// The log holds size bytes already: this read does not wait.
		_, err := io.ReadFull(r, buf)
		r.Close()
		if err != nil {
			return nil, outputOut{}, fmt.Errorf("reading the output of %s: %w", p.ID(), err)
		}
		out.NextOffset = in.Offset + n
		out.More = out.NextOffset < size
		out.Output = string(buf)
		if !utf8.Valid(buf) {
			out.Encoding, out.Output = "base64", base64.StdEncoding.EncodeToString(buf)
		}
	}
	if ended {
		res, err := p.Wait(ctx)
		if res != nil {
			r := toExecuteOut(res)
			out.Result = &r
		}
		if err != nil && res == nil {
			return nil, out, fmt.Errorf("process %s: %w", p.ID(), err)
		}
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: outputText(out)}}}, out, nil
}

// outputText is what a person or a model reads: the output itself, then
// where it stands.
func outputText(out outputOut) string {
	state := "running"
	if out.Result != nil {
		state = fmt.Sprintf("ended: exit %d (%s), transaction %q", out.Result.ExitCode, out.Result.Termination, out.Result.Transaction)
		if len(out.Result.NetRefused) > 0 {
			state += "\n" + netRefusedText(out.Result.NetRefused)
		}
	}
	return fmt.Sprintf("%s\n[process %s: bytes %d..%d, %s; more: %v]", out.Output, out.ProcessID, out.Offset, out.NextOffset, state, out.More)
}

func isDone(p *sandbox.Process) bool {
	select {
	case <-p.Done():
		return true
	default:
		return false
	}
}

// waitForOutput returns once p has printed past offset, has ended, ctx
// has ended or d has passed.
func waitForOutput(ctx context.Context, p *sandbox.Process, offset int64, d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	// The output log has no notification; a short poll costs little next
	// to a tool call's round trip.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for p.OutputSize() <= offset {
		select {
		case <-p.Done():
			return
		case <-ctx.Done():
			return
		case <-timer.C:
			return
		case <-tick.C:
		}
	}
}

func (t *mcpTools) kill(ctx context.Context, _ *mcp.CallToolRequest, in processIn) (*mcp.CallToolResult, executeOut, error) {
	p, err := t.procs.get(in.ProcessID)
	if err != nil {
		return nil, executeOut{}, err
	}
	if err := p.Kill(); err != nil && !isDone(p) {
		return nil, executeOut{}, fmt.Errorf("kill %s: %w", p.ID(), err)
	}
	res, err := p.Wait(ctx)
	if res == nil {
		if err == nil {
			err = errors.New("the sandbox returned no result")
		}
		return nil, executeOut{}, fmt.Errorf("process %s: %w", p.ID(), err)
	}
	out := toExecuteOut(res)
	return resultText(out), out, nil
}

type inputIn struct {
	ProcessID string `json:"process_id"`
	Input     string `json:"input,omitempty" jsonschema:"the bytes to write, as UTF-8 text"`
	Close     bool   `json:"close,omitempty" jsonschema:"close standard input after writing"`
}

type inputOut struct {
	ProcessID string `json:"process_id"`
	Written   int    `json:"written_bytes"`
	Closed    bool   `json:"closed"`
}

func (t *mcpTools) sendInput(ctx context.Context, _ *mcp.CallToolRequest, in inputIn) (*mcp.CallToolResult, inputOut, error) {
	p, err := t.procs.get(in.ProcessID)
	if err != nil {
		return nil, inputOut{}, err
	}
	out := inputOut{ProcessID: p.ID()}
	if in.Input != "" {
		// A process that does not read would block the write, and with it
		// this call, for good: the call's context bounds it (the write
		// given up on may still be delivered, before any later one).
		n, err := writeCtx(ctx, p, []byte(in.Input))
		out.Written = n
		if err != nil {
			return nil, out, fmt.Errorf("writing to %s (%d bytes written): %w", p.ID(), n, err)
		}
	}
	if in.Close {
		if err := p.Stdin().Close(); err != nil {
			return nil, out, fmt.Errorf("closing the input of %s: %w", p.ID(), err)
		}
		out.Closed = true
	}
	return nil, out, nil
}

// writeCtx writes b to p's input, giving up when ctx ends or p does.
func writeCtx(ctx context.Context, p *sandbox.Process, b []byte) (int, error) {
	type res struct {
		n   int
		err error
	}
	done := make(chan res, 1)
	go func() {
		n, err := p.Stdin().Write(b)
		done <- res{n, err}
	}()
	select {
	case r := <-done:
		return r.n, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-p.Done():
		select {
		case r := <-done:
			return r.n, r.err
		default:
			return 0, errors.New("the process has ended")
		}
	}
}

type processInfo struct {
	ProcessID string `json:"process_id"`
	Command   string `json:"command"`
	StartedAt string `json:"started_at"`
	Running   bool   `json:"running"`
	OutputLen int64  `json:"output_bytes"`
}

type listProcessesOut struct {
	Processes []processInfo `json:"processes"`
}

func (t *mcpTools) listProcesses(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, listProcessesOut, error) {
	out := listProcessesOut{Processes: []processInfo{}}
	for _, p := range t.procs.all() {
		out.Processes = append(out.Processes, processInfo{ProcessID: p.ID(), Command: p.Command(),
			StartedAt: p.StartedAt().UTC().Format(time.RFC3339Nano), Running: !isDone(p), OutputLen: p.OutputSize()})
	}
	return nil, out, nil
}

type exposeIn struct {
	Port int `json:"port" jsonschema:"the TCP port inside the sandbox"`
}

type exposeOut struct {
	Port    int    `json:"port"`
	Address string `json:"address" jsonschema:"host:port on the host's loopback that relays to the port"`
	URL     string `json:"url" jsonschema:"http:// URL of the address, for an HTTP server"`
}

func (t *mcpTools) expose(ctx context.Context, _ *mcp.CallToolRequest, in exposeIn) (*mcp.CallToolResult, exposeOut, error) {
	addr, err := t.sb.Expose(ctx, in.Port)
	if err != nil {
		return nil, exposeOut{}, err
	}
	t.exposed.Store(true)
	return nil, exposeOut{Port: in.Port, Address: addr, URL: "http://" + addr}, nil
}

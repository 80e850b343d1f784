package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/docker/docker/client"

	"github.com/pulse-agent/pulse/backend/docker"
)

func init() {
	register(command{
		name:    "image",
		summary: "build the Docker sandbox image offline, from programs on this host",
		usage:   []string{"pulse image build [--tag T] [--busybox PATH] [--bash PATH|-] [--with PROG]..."},
		help: `Builds the image the Docker backend runs commands in, offline, from programs
installed on this host: a static busybox, bash and make (when the host has
it), and each --with PROG. A program comes in as the real program behind any
symlink or launcher (pyenv and other shims), with its shared libraries and its
runtime files: a Go toolchain's GOROOT, python's standard library, git's
helpers and templates. Before the image gets its tag, each program's check
(PROG --version or an equivalent) runs inside it. Progress goes to stderr.
Exit code 1 when the engine refuses, or a program is missing or does not run
in the image (the message says why).`,
		subcommands: []string{"build"},
		run:         runImage,
	})
}

// defaultImagePrograms are copied into the image when the host has them,
// with or without --with, so that the usual `make test` of a workspace
// runs in the sandbox.
var defaultImagePrograms = []string{"make"}

// runImage implements `pulse image build [--tag T] [--busybox PATH] [--bash PATH|-] [--with PROG]...`.
func runImage(ctx context.Context, env *cliEnv, args []string) int {
	if len(args) > 0 && isHelp(args[0]) {
		return commandHelp(env, "image")
	}
	if len(args) == 0 || args[0] != "build" {
		problem := "no subcommand given"
		if len(args) > 0 {
			problem = fmt.Sprintf("unknown subcommand %q", args[0])
		}
		return usageError(env, newFlagSet(env, "image"), problem)
	}
	fs := newFlagSet(env, "image build")
	def := env.getenv(docker.ImageEnv)
	if def == "" {
		def = docker.DefaultImage
	}
	tag := fs.String("tag", def, "image reference to build (default: $"+docker.ImageEnv+" or "+docker.DefaultImage+")")
	busybox := fs.String("busybox", "/bin/busybox", "static busybox binary to build the image around")
	bash := fs.String("bash", "/bin/bash", `host bash to copy in with its libraries ("-" for none)`)
	asJSON := fs.Bool("json", false, "print {tag, id} of the built image as JSON")
	var with stringList
	fs.Var(&with, "with", "host program to bring in with its libraries and runtime files (repeatable; make comes too, when the host has it)")
	if code, done := parseFlags(env, fs, args[1:]); done {
		return code
	}
	var programs []string
	for _, p := range defaultImagePrograms {
		if _, err := exec.LookPath(p); err == nil {
			programs = append(programs, p)
		}
	}
	programs = append(programs, with...)
	if fs.NArg() != 0 {
		return usageError(env, fs, fmt.Sprintf("unexpected argument %q", fs.Arg(0)))
	}
	opts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
	if h := env.getenv("DOCKER_HOST"); h != "" {
		opts = append(opts, client.WithHost(h))
	}
	cli, err := client.NewClientWithOpts(opts...)
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse image build: %v\n", err)
		return exitFailure
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	prog := newProgress(env)
	prog.set("building the image " + *tag)
	id, err := docker.BuildImage(ctx, cli, docker.ImageSpec{Tag: *tag, Busybox: *busybox, Bash: *bash, Programs: programs,
		Progress: buildLines{env: env, prog: prog}})
	prog.close()
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse image build: %v\n", err)
		return exitFailure
	}
	if *asJSON {
		writeJSON(env.stdout, map[string]string{"tag": *tag, "id": id})
		return exitOK
	}
	fmt.Fprintf(env.stdout, "built %s (%s)\n", *tag, id)
	return exitOK
}

// buildLines prints each progress line of the build on stderr; on a
// terminal the line also becomes the step the progress line times.
type buildLines struct {
	env  *cliEnv
	prog *progress
}

func (b buildLines) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\n")
	if b.prog == nil {
		fmt.Fprintf(b.env.stderr, "pulse image build: %s\n", line)
		return len(p), nil
	}
	b.prog.mu.Lock()
	b.prog.clearLocked()
	fmt.Fprintf(b.prog.w, "pulse image build: %s\n", line)
	b.prog.step, b.prog.from = line, time.Now()
	b.prog.mu.Unlock()
	return len(p), nil
}

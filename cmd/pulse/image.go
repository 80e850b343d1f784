package main

import (
	"context"
	"fmt"
	"os/exec"
	"time"

	"github.com/docker/docker/client"

	"github.com/pulse-agent/pulse/backend/docker"
)

func init() {
	register(command{
		name:    "image",
		summary: "build the Docker sandbox image offline, from programs on this host",
		usage:   []string{"pulse image build [--tag T] [--busybox PATH] [--bash PATH|-] [--with PROG]..."},
		help: `Builds the image the Docker backend runs commands in, around a static busybox
and the host's bash (and make, or each --with PROG) with their libraries. It
needs no registry. Exit code 1 when the engine refuses or a program is missing.`,
		subcommands: []string{"build"},
		run:         runImage,
	})
}

// defaultImagePrograms are copied into the image when the host has them,
// so that the usual `make test` of a workspace runs in the sandbox.
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
	fs.Var(&with, "with", "host program to copy in with its libraries (repeatable; default: make, when the host has it)")
	if code, done := parseFlags(env, fs, args[1:]); done {
		return code
	}
	programs := []string(with)
	if len(programs) == 0 {
		for _, p := range defaultImagePrograms {
			if _, err := exec.LookPath(p); err == nil {
				programs = append(programs, p)
			}
		}
	}
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
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	prog := newProgress(env)
	prog.set("building the image " + *tag)
	id, err := docker.BuildImage(ctx, cli, docker.ImageSpec{Tag: *tag, Busybox: *busybox, Bash: *bash, Programs: programs})
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

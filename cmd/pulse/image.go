package main

import (
	"context"
	"flag"
	"fmt"
	"os/exec"
	"time"

	"github.com/docker/docker/client"

	"github.com/pulse-agent/pulse/backend/docker"
)

func init() {
	register(command{
		name:    "image",
		summary: "build the Docker sandbox image offline (image build [--tag T])",
		run:     runImage,
	})
}

// defaultImagePrograms are copied into the image when the host has them,
// so that the usual `make test` of a workspace runs in the sandbox.
var defaultImagePrograms = []string{"make"}

// runImage implements `pulse image build [--tag T] [--busybox PATH] [--bash PATH|-] [--with PROG]...`.
func runImage(ctx context.Context, env *cliEnv, args []string) int {
	if len(args) == 0 || args[0] != "build" {
		fmt.Fprintln(env.stderr, "usage: pulse image build [--tag T] [--busybox PATH] [--bash PATH|-] [--with PROG]...")
		return exitUsage
	}
	fs := flag.NewFlagSet("image build", flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	def := env.getenv(docker.ImageEnv)
	if def == "" {
		def = docker.DefaultImage
	}
	tag := fs.String("tag", def, "image reference to build (default: $"+docker.ImageEnv+" or "+docker.DefaultImage+")")
	busybox := fs.String("busybox", "/bin/busybox", "static busybox binary to build the image around")
	bash := fs.String("bash", "/bin/bash", `host bash to copy in with its libraries ("-" for none)`)
	var with stringList
	fs.Var(&with, "with", "host program to copy in with its libraries (repeatable; default: make, when the host has it)")
	if err := fs.Parse(args[1:]); err != nil {
		return exitUsage
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
		fmt.Fprintf(env.stderr, "pulse image build: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
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
	id, err := docker.BuildImage(ctx, cli, docker.ImageSpec{Tag: *tag, Busybox: *busybox, Bash: *bash, Programs: programs})
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse image build: %v\n", err)
		return exitFailure
	}
	fmt.Fprintf(env.stdout, "built %s (%s)\n", *tag, id)
	return exitOK
}

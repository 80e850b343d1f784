package main

import (
	"context"
	"flag"
	"fmt"
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

// runImage implements `pulse image build [--tag T] [--busybox PATH] [--bash PATH|-]`.
func runImage(ctx context.Context, env *cliEnv, args []string) int {
	if len(args) == 0 || args[0] != "build" {
		fmt.Fprintln(env.stderr, "usage: pulse image build [--tag T] [--busybox PATH] [--bash PATH|-]")
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
	if err := fs.Parse(args[1:]); err != nil {
		return exitUsage
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
	id, err := docker.BuildImage(ctx, cli, docker.ImageSpec{Tag: *tag, Busybox: *busybox, Bash: *bash})
	if err != nil {
		fmt.Fprintf(env.stderr, "pulse image build: %v\n", err)
		return exitFailure
	}
	fmt.Fprintf(env.stdout, "built %s (%s)\n", *tag, id)
	return exitOK
}
